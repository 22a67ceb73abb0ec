"""The training step: its spec (loss, target, optimizer), the counted step (forward, backward,
optimizer), autograd attribution of backward ops to module calls, its timing and its columns."""
