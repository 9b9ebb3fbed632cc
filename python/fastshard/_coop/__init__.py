"""The cooperative load: its rounds (load), who fetches which piece of one
file for a group of ranks (plan), the exchange over shared memory or
torch.distributed, and the link between the ranks (peers).
``fastshard.cooperative`` re-exports its public face."""
