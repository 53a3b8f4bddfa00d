"""TransformerModel: a BERT encoder over a video's frames, pooled, context-gated and classified, after the 2019
YouTube-8M entry of Shao & Liu (see the class docstring); frames are sampled to bound the attention's cost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from yt8m.fields import setting
from yt8m.models.base import BaseModel
from yt8m.models.frame import FrameClassifierHParams, _frame_counts
from yt8m.models.gating import ContextGating
from yt8m.models.registry import create_classifier, register_model

POOLINGS = ("mean", "first")
# BERT's initializer_range and layer-norm epsilon.
INIT_STDDEV = 0.02
NORM_EPS = 1e-12


@dataclass(frozen=True)
class TransformerHParams(FrameClassifierHParams):
    transformer_layers: int = setting(2, "TransformerModel: encoder layers.", at_least=1)
    transformer_heads: int = setting(12, "TransformerModel: attention heads per layer; they split the hidden size.",
                                     at_least=1)
    transformer_hidden_size: int = setting(1152, "TransformerModel: encoder width; each frame is projected to it.",
                                           at_least=1)
    transformer_ffn_multiplier: int = setting(4, "TransformerModel: feed-forward width, in hidden sizes.", at_least=1)
    transformer_dropout: float = setting(0.1, "TransformerModel: dropout of the attention and the residuals.",
                                         at_least=0, at_most=0.9)
    transformer_pooling: str = setting("mean", "TransformerModel: 'mean' of the real frames' outputs, or 'first' "
                                       "(a learned [CLS] token's output).", choices=lambda: POOLINGS)
    transformer_max_frames: int = setting(300, "TransformerModel: frames attended per video; longer videos are "
                                          "sampled (training: at random, in order; evaluation: evenly spaced).",
                                          at_least=1)

    def problems(self) -> list[str]:
        if self.transformer_heads > 0 and self.transformer_hidden_size % self.transformer_heads:
            return [f"--transformer_hidden_size ({self.transformer_hidden_size}) must be a multiple of "
                    f"--transformer_heads ({self.transformer_heads})"]
        return []


class EncoderLayer(nn.Module):
    """One BERT layer: multi-head self-attention over the unmasked frames, then a GELU feed-forward; each with
    dropout, a residual connection and layer norm after it."""

    def __init__(self, size: int, heads: int, ffn_size: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(size, 3 * size)
        self.out = nn.Linear(size, size)
        self.attention_norm = nn.LayerNorm(size, eps=NORM_EPS)
        self.ffn = nn.Sequential(nn.Linear(size, ffn_size), nn.GELU(), nn.Linear(ffn_size, size))
        self.ffn_norm = nn.LayerNorm(size, eps=NORM_EPS)

    def forward(self, tokens: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        """tokens [batch, length, size]; attend [batch, 1, 1, length], False for the keys nobody may read."""
        batch, length, size = tokens.shape
        query, key, value = self.qkv(tokens).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        dropout = self.dropout if self.training else 0.0
        mixed = F.scaled_dot_product_attention(query, key, value, attn_mask=attend, dropout_p=dropout)
        mixed = self.out(mixed.transpose(1, 2).reshape(batch, length, size))
        tokens = self.attention_norm(tokens + F.dropout(mixed, dropout, self.training))
        return self.ffn_norm(tokens + F.dropout(self.ffn(tokens), dropout, self.training))


@register_model(TransformerHParams)
class TransformerModel(BaseModel):
    """Transformer pooling of frames: Shao & Liu 2019, "BERT for Large-scale Video Segment Classification with
    Test-time Augmentation" (3rd YouTube-8M challenge, 9th of 283; arXiv 1912.01127, Sec. 3 and the entry's
    published configurations). Their best single models are BERTMean(L2H12) and BERTFirst(L2H12): 2 layers of 12
    heads over the concatenated rgb+audio frames (1152 wide), the outputs averaged or the first token taken, then a
    MoE; trained with Adam at 1e-4, batch 128, MoE L2 1e-6 (configs/transformer.yaml). The defaults are those.

    Each frame is projected to `transformer_hidden_size`, given a learned embedding of its slot (0, 1, ... in
    time order: BERT's position embeddings) and layer-normalized. Padding slots are masked as attention keys and
    left out of the mean. A video with more than `transformer_max_frames` frames is sampled: random frames kept in
    order while training, evenly spaced ones in evaluation, so that a prediction does not change from run to run.
    The pooled vector goes through context gating (WILLOW, Miech et al. 2017, Sec. 3.2; with a bias rather than
    batch norm, so that nothing depends on the batch) into `video_level_classifier_model`.
    """

    frame_level = True

    def __init__(self, feature_size: int, num_classes: int, hparams: TransformerHParams = TransformerHParams()):
        super().__init__(feature_size, num_classes, hparams)
        size, pooling = hparams.transformer_hidden_size, hparams.transformer_pooling
        self.max_frames, self.pooling = hparams.transformer_max_frames, pooling
        self.dropout = hparams.transformer_dropout
        self.embed = nn.Linear(feature_size, size)
        self.slot_embedding = nn.Parameter(torch.empty(hparams.transformer_max_frames, size))
        self.first_token = nn.Parameter(torch.empty(size)) if pooling == "first" else None
        self.embed_norm = nn.LayerNorm(size, eps=NORM_EPS)
        self.layers = nn.ModuleList(EncoderLayer(size, hparams.transformer_heads,
                                                 size * hparams.transformer_ffn_multiplier, self.dropout)
                                    for _ in range(hparams.transformer_layers))
        self._init_like_bert()
        self.gating = ContextGating(size, batch_norm=False)
        assert self.gating.bias is not None  # a gate without batch norm has a bias
        nn.init.zeros_(self.gating.bias)  # BERT's zero biases (_init_like_bert), not WILLOW's random ones
        self.classifier = create_classifier(hparams, size, num_classes)

    def _init_like_bert(self) -> None:
        """Weights and embeddings ~ N(0, 0.02), biases 0, layer norms the identity (BERT's initializer)."""
        for name, parameter in self.named_parameters():
            if "norm" in name:
                continue
            if parameter.dim() > 1 or name == "first_token":
                nn.init.normal_(parameter, std=INIT_STDDEV)
            else:
                nn.init.zeros_(parameter)

    def frame_indices(self, counts: torch.Tensor, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """([batch, slots] frame indices to read, [batch, slots] True where the slot holds a real frame).

        Evaluation always fills `transformer_max_frames` slots, a shape the ONNX export can keep whatever the
        frame axis; training uses no more slots than the batch has frames."""
        slots = torch.arange(self.max_frames if not self.training else min(self.max_frames, frames),
                             device=counts.device)
        real = slots < counts[:, None]
        if self.training and frames > self.max_frames:
            order = torch.rand(len(counts), frames, device=counts.device)
            order = order + (torch.arange(frames, device=counts.device) >= counts[:, None])  # padding sorts last
            index = order.topk(len(slots), dim=1, largest=False).indices.sort(dim=1).values
            return index, index < counts[:, None]
        spaced = ((slots + 0.5) * counts[:, None] / self.max_frames).long()
        index = torch.where(counts[:, None] > self.max_frames, spaced, torch.minimum(slots, counts[:, None] - 1))
        return index, real

    classifier_name = "classifier"

    def compute_logits(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        return self.classifier.compute_logits(self.shared_features(features, num_frames), None)

    def shared_features(self, features: torch.Tensor, num_frames: Optional[torch.Tensor]) -> torch.Tensor:
        """The pooled encoder output through context gating: what the classifier reads, a multi-task trunk's."""
        batch, frames, size = features.shape
        index, real = self.frame_indices(_frame_counts(features, num_frames), frames)
        chosen = features.gather(1, index.unsqueeze(-1).expand(-1, -1, size))
        tokens = self.embed(chosen) + self.slot_embedding[:index.shape[1]]
        if self.first_token is not None:
            tokens = torch.cat([self.first_token.expand(batch, 1, -1), tokens], dim=1)
            real = torch.cat([real.new_ones(batch, 1), real], dim=1)
        tokens = F.dropout(self.embed_norm(tokens), self.dropout, self.training)
        attend = real[:, None, None, :]
        for layer in self.layers:
            tokens = layer(tokens, attend)
        if self.first_token is not None:
            pooled = tokens[:, 0]
        else:
            weights = real.to(tokens.dtype).unsqueeze(-1)
            pooled = (tokens * weights).sum(dim=1) / weights.sum(dim=1)
        return self.gating(pooled)

    @property
    def shared_size(self) -> int:
        return self.slot_embedding.shape[-1]

    def penalized_weights(self) -> list[torch.Tensor]:
        return [self.gating.weight]
