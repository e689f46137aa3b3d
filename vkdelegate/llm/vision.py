"""The ``vision_encoder`` method: a vision tower + projector behind one signature.

vision_encoder(pixel_values float[1, P, C*p*p], pixel_position_ids int64[1, P, 2])
-> (image_embeds float[1, S, D], pooler_mask bool[1, S]), P (patches) dynamic.
``image_embeds`` rows are soft tokens in the decoder's embedding space;
``pooler_mask`` marks the valid ones (a pooler that groups patches into S slots
leaves slots no patch fell into padded). ``generate`` splices only valid rows.
"""
from __future__ import annotations

from torch import nn

from vkdelegate.errors import VkDelegateError


class VisionEncoder(nn.Module):
    """Wraps ``vision``: a module ``(pixel_values, pixel_position_ids) ->
    (image_embeds, pooler_mask)``, or a (tower, projector) pair where the tower
    returns (hidden [1, S, H], pooler_mask [1, S]) and the projector maps hidden to
    [1, S, D]. The tower (or the module) has ``patch_dim`` (C*p*p) and
    ``max_patches`` (the largest P) attributes, used for the export's example inputs
    and the dynamic P. Raises VkDelegateError when they are missing."""

    def __init__(self, vision):
        super().__init__()
        if isinstance(vision, (tuple, list)):
            if len(vision) != 2:
                raise VkDelegateError("vision= takes a module or a (tower, projector) "
                                      "pair")
            self.tower, self.projector = vision
        else:
            self.tower, self.projector = vision, None
        for attr in ("patch_dim", "max_patches"):
            if not isinstance(getattr(self.tower, attr, None), int):
                raise VkDelegateError(f"the vision tower needs an int {attr!r} "
                                      f"attribute (see vkdelegate.llm.vision)")
        self.patch_dim = self.tower.patch_dim
        self.max_patches = self.tower.max_patches

    def forward(self, pixel_values, pixel_position_ids):
        hidden, mask = self.tower(pixel_values, pixel_position_ids)
        embeds = hidden if self.projector is None else self.projector(hidden)
        return embeds, mask.bool()
