"""Recording ATen calls on lazy tensors into IR nodes."""
