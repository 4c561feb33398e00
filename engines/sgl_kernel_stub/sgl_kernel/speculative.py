"""Stand-in for `sgl_kernel.speculative`: every name raises RuntimeError when called (CPU test scaffolding)."""

from sgl_kernel._stub import unavailable

reconstruct_indices_from_tree_mask = unavailable("speculative.reconstruct_indices_from_tree_mask")
