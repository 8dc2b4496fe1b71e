"""Every PyTorch hook: device registration, device kernels, autocast, torch.compile, export."""
