"""Training's optimizer step as the starter kit takes it: gradients of label loss plus L2 penalties, each clipped to
its own norm, then any torch.optim optimizer (torch's fused Adam on the CPU, the default).

The L2 penalties' gradient (coefficient x weight) is added here, not through autograd: the same sum in fewer passes.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Optional, Protocol, Sequence

import torch
from torch import nn

from yt8m.fields import problem_of, setting

# TensorFlow optimizer class names from starter-kit command lines, with the TF defaults torch lacks.
TF_OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "AdamOptimizer": ("Adam", {}),
    "GradientDescentOptimizer": ("SGD", {}),
    "MomentumOptimizer": ("SGD", {"momentum": 0.9}),
    "AdagradOptimizer": ("Adagrad", {"initial_accumulator_value": 0.1}),
    "RMSPropOptimizer": ("RMSprop", {"alpha": 0.9, "eps": 1e-10}),
    "AdadeltaOptimizer": ("Adadelta", {"rho": 0.95, "eps": 1e-8}),
}
L2Terms = Sequence[tuple[torch.Tensor, float]]
# The key of an optimizer_state's parameter names, in the order of torch's positions.
PARAM_NAMES = "param_names"


def optimizer_problem(name: str) -> Optional[str]:
    """The check of --optimizer."""
    return problem_of(lambda: optimizer_class(name))


@dataclass(frozen=True)
class OptimizerConfig:
    """The `optimizer` section: the optimizer, its base learning rate (the `lr_schedule` section's schedule scales
    it), gradient clipping, the L2 penalties' weight, weight decay, and the moving average of the weights that is
    evaluated."""

    name: str = setting("Adam", "Any torch.optim class name (TF names such as AdamOptimizer accepted).",
                        flag="optimizer", check=optimizer_problem)
    base_learning_rate: float = setting(0.01, "Initial learning rate.", above=0)
    clip_gradient_norm: float = setting(1.0, "Clip each parameter's gradient to this norm, as the starter kit's "
                                             "per-variable clip_by_norm (0 disables).", at_least=0)
    clip_gradient_value: float = setting(0.0, "Clip each gradient element to [-v, v] before the norm clipping (0 "
                                              "disables); --clip_gradient_norm 0 leaves value clipping alone.",
                                         at_least=0)
    regularization_penalty: float = setting(1.0, "Weight of the models' L2 penalties in the loss.", at_least=0)
    ema_decay: float = setting(0.0, "Evaluate, checkpoint, export and predict with an exponential moving average of "
                                    "the weights, updated after every step with this decay (e.g. 0.998; warmed up as "
                                    "min(decay, (1 + step) / (10 + step))); 0 uses the trained weights as they are.",
                               at_least=0, at_most=0.99999)
    swa_start_epoch: int = setting(0, "Stochastic weight averaging (Izmailov et al. 2018): from the end of this epoch "
                                      "on, evaluate, checkpoint, export and predict with the equal average of the "
                                      "weights at each epoch's end (0: off; instead of --ema_decay).", at_least=0)
    weight_decay: Optional[float] = setting(None, "The optimizer's weight_decay (AdamW: decoupled weight decay, "
                                                  "Loshchilov and Hutter 2019; Adam, SGD: an L2 term in the "
                                                  "gradient); None: the optimizer's default.", at_least=0)
    no_decay_biases_and_norms: bool = setting(False, "Leave biases and normalization weights (every parameter of "
                                                     "fewer than 2 dimensions) out of --weight_decay, in a "
                                                     "parameter group of their own, as AdamW users expect.")

    # The starter kit's decay, now the `lr_schedule` section's exponential schedule's (config.yaml files written
    # before name them here).
    MOVED_OUT: ClassVar[tuple[str, ...]] = ("learning_rate_decay", "learning_rate_decay_examples")

    def average_problems(self) -> list[str]:
        """The weight averages are alternatives: one is evaluated."""
        if self.ema_decay and self.swa_start_epoch:
            return ["--ema_decay and --swa_start_epoch both average the weights: choose one"]
        return []


def optimizer_class(name: str) -> tuple[Callable[..., torch.optim.Optimizer], dict[str, Any]]:
    """The torch.optim class (case-insensitive) or TensorFlow optimizer name, with the TF defaults torch lacks."""
    class_name, defaults = TF_OPTIMIZERS.get(name, (name, {}))
    classes = {
        cls.__name__.lower(): cls for cls in vars(torch.optim).values()
        # LBFGS needs a loss closure per step, which a streaming loop cannot give it.
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
        and cls not in (torch.optim.Optimizer, torch.optim.LBFGS)
    }
    if class_name.lower() not in classes:
        known = sorted(cls.__name__ for cls in classes.values()) + sorted(TF_OPTIMIZERS)
        raise ValueError(f"{name!r} is not a torch.optim class; known: {', '.join(known)}")
    return classes[class_name.lower()], defaults


def build_optimizer(config: OptimizerConfig, parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The section's optimizer (any torch.optim class by name, case-insensitive, or a TensorFlow optimizer name) at
    its base learning rate; with --no_decay_biases_and_norms, the parameters of fewer than 2 dimensions in a second
    group without weight decay."""
    cls, defaults = optimizer_class(config.name)
    takes_decay = "weight_decay" in inspect.signature(cls).parameters
    if config.weight_decay is not None:
        if not takes_decay:
            raise ValueError(f"--weight_decay: {cls.__name__} takes no weight_decay")
        defaults = {**defaults, "weight_decay": config.weight_decay}
    lr = config.base_learning_rate
    groups: Any = list(parameters)
    if config.no_decay_biases_and_norms and takes_decay:
        decayed = [parameter for parameter in groups if parameter.dim() >= 2]
        undecayed = [parameter for parameter in groups if parameter.dim() < 2]
        groups = [group for group in ({"params": decayed}, {"params": undecayed, "weight_decay": 0.0})
                      if group["params"]]
    if "fused" in inspect.signature(cls).parameters:
        # One fused kernel per step instead of a dozen passes over the weights: several times faster.
        try:
            return cls(groups, lr=lr, fused=True, **defaults)
        except RuntimeError:  # the device or dtype has no fused kernel
            pass
    return cls(groups, lr=lr, **defaults)


class Penalized(Protocol):
    """A model with the starter kit's L2 penalties: (weight, l2_penalty) of each penalized weight (BaseModel's)."""

    def l2_penalties(self) -> list[tuple[torch.Tensor, float]]: ...


def l2_terms(model: Penalized, regularization_penalty: float) -> list[tuple[torch.Tensor, float]]:
    """(weight, coefficient) of each L2 penalty in the loss, regularization_penalty x the model's l2_penalty: the
    gradient of regularization_penalty x l2_penalty x sum(w^2) / 2 is coefficient x w."""
    if not regularization_penalty:
        return []
    return [(weight, regularization_penalty * penalty) for weight, penalty in model.l2_penalties()]


def apply_update(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                 clip_gradient_norm: float, clip_gradient_value: float = 0.0, penalties: L2Terms = ()) -> None:
    """The optimizer step on the accumulated gradients of the label loss, the L2 `penalties` added: the sum
    clipped by value, then each weight's by its own norm."""
    if clip_gradient_norm > 0 or clip_gradient_value > 0 or penalties:
        scaler.unscale_(optimizer)  # the penalties' gradients are added to true, unscaled gradients
    for weight, _ in penalties:
        if weight.grad is None:  # a weight the batch did not reach still has its penalty's gradient
            weight.grad = torch.zeros_like(weight)
    add_penalty_gradients(penalties)
    if clip_gradient_value > 0:
        nn.utils.clip_grad_value_(model.parameters(), clip_gradient_value)
    if clip_gradient_norm > 0:
        clip_each_gradient_norm(model.parameters(), clip_gradient_norm)
    scaler.step(optimizer)
    scaler.update()


def add_penalty_gradients(penalties: L2Terms) -> None:
    """Add coefficient x weight to each penalized weight's gradient, one _foreach pass per coefficient.

    A step of torch's fused Adam after these _foreach passes came within 2% of a hand-written fused step (the
    penalty, the norm, the clipping and Adam in two passes per weight), which was deleted (bench/README.md)."""
    by_coefficient: dict[float, list[torch.Tensor]] = {}
    for weight, coefficient in penalties:
        by_coefficient.setdefault(coefficient, []).append(weight)
    for coefficient, weights in by_coefficient.items():
        grads = [weight.grad for weight in weights if weight.grad is not None]  # apply_update gave each one
        torch._foreach_add_(grads, [weight.detach() for weight in weights], alpha=coefficient)


def clip_each_gradient_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> None:
    """Scale each parameter's gradient to a norm of at most `max_norm`, on its own: the starter kit's
    clip_gradient_norms (tf.clip_by_norm per variable), not one global norm over all of them."""
    grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if not grads:
        return
    for grad, norm in zip(grads, torch._foreach_norm(grads)):
        if grad.device.type != "cpu":  # no host sync on an accelerator: always scale, by 1 when within the bound
            grad.mul_(max_norm / norm.clamp(min=max_norm))
        elif norm > max_norm:  # on the CPU a gradient within the bound is left alone: a pass over it saved
            grad.mul_(max_norm / norm)


def optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module) -> dict[str, Any]:
    """The optimizer's state dict with each parameter's name beside its position: torch keys a parameter's state by
    its position, which the same parameters in another order (a reordered `tasks:` list) would scramble."""
    state = optimizer.state_dict()
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    state[PARAM_NAMES] = [names[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]
    return state


def load_optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module, saved: dict[str, Any],
                         source: str) -> None:
    """Load an `optimizer_state` into `optimizer`, each parameter's state by name; a ValueError naming each parameter
    whose state is missing or of another shape (`resumable_optimizer_state` says so before a run starts)."""
    optimizer.load_state_dict(resumable_optimizer_state(optimizer, model, saved, source))


def resumable_optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module, saved: dict[str, Any],
                              source: str) -> dict[str, Any]:
    """`saved` with its parameters' states in `optimizer`'s order (by name; a state saved without names keeps its
    order), checked: a ValueError names the parameters whose state is missing or of another shape."""
    ordered = [(name, parameter) for name, parameter in _named_in_order(optimizer, model)]
    saved_names = saved.get(PARAM_NAMES) or [name for name, _ in ordered]
    saved_groups = saved["param_groups"]
    saved_ids = [index for group in saved_groups for index in group["params"]]
    by_name = dict(zip(saved_names, saved_ids))
    problems = [f"{name}: not in the checkpoint's optimizer state" for name, _ in ordered if name not in by_name]
    problems += [f"{name}: only in the checkpoint's optimizer state" for name in saved_names
                 if name not in dict(ordered)]
    state = {}
    for position, (name, parameter) in enumerate(ordered):
        entry = saved["state"].get(by_name.get(name))
        if entry is None:
            continue
        shapes = {key: list(value.shape) for key, value in entry.items() if torch.is_tensor(value) and value.dim()}
        wrong = {key: shape for key, shape in shapes.items() if shape != list(parameter.shape)}
        if wrong:
            problems.append(f"{name}: optimizer state of shape {next(iter(wrong.values()))} in the checkpoint, "
                            f"{list(parameter.shape)} here")
        state[position] = entry
    if problems:
        raise ValueError(f"{source}: its optimizer state does not fit this model's parameters ({len(problems)}): "
                         + "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else ""))
    groups = [dict(group, params=[]) for group in saved_groups]
    counts = [len(group["params"]) for group in optimizer.param_groups]
    positions = iter(range(len(ordered)))
    for group, count in zip(groups, counts):
        group["params"] = [next(positions) for _ in range(count)]
    return {"state": state, "param_groups": groups}


def _named_in_order(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    return [(names[id(parameter)], parameter) for group in optimizer.param_groups for parameter in group["params"]]
