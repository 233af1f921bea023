"""The lazy device: the tensor subclass that holds IR instead of data, and the factory kernels."""
