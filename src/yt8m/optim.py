"""Training's optimizer step as the starter kit takes it: gradients of label loss plus L2 penalties, each clipped to
its own norm, then any torch.optim optimizer; on the CPU in float32, Adam's step is one fused pass per weight.

The L2 penalties' gradient (coefficient x weight) is added here, not through autograd: the same sum in fewer passes.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from yt8m.kernels import ELEMENTS_PER_THREAD, _kernels, as_arrays, over_rows, use_fused_kernels

# TensorFlow optimizer class names from starter-kit command lines, with the TF defaults torch lacks.
TF_OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "AdamOptimizer": ("Adam", {}),
    "GradientDescentOptimizer": ("SGD", {}),
    "MomentumOptimizer": ("SGD", {"momentum": 0.9}),
    "AdagradOptimizer": ("Adagrad", {"initial_accumulator_value": 0.1}),
    "RMSPropOptimizer": ("RMSprop", {"alpha": 0.9, "eps": 1e-10}),
    "AdadeltaOptimizer": ("Adadelta", {"rho": 0.95, "eps": 1e-8}),
}
# Adam options the fused step implements; any other value goes through torch's own step.
_FUSED_ADAM_OPTIONS = {"weight_decay": 0, "amsgrad": False, "maximize": False, "capturable": False,
                       "differentiable": False, "decoupled_weight_decay": False}

L2Terms = Sequence[tuple[nn.Parameter, float]]


def optimizer_class(name: str) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
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


def build_optimizer(name: str, parameters: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """Any torch.optim class by name (case-insensitive), or a TensorFlow optimizer name."""
    cls, defaults = optimizer_class(name)
    parameters = list(parameters)
    if "fused" in inspect.signature(cls).parameters:
        # One fused kernel per step instead of a dozen passes over the weights: several times faster.
        try:
            return cls(parameters, lr=lr, fused=True, **defaults)
        except RuntimeError:  # the device or dtype has no fused kernel
            pass
    return cls(parameters, lr=lr, **defaults)


def l2_terms(model: nn.Module, regularization_penalty: float) -> list[tuple[nn.Parameter, float]]:
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
    if fused_adam_applies(optimizer, scaler, clip_gradient_value):
        fused_adam_step(optimizer, clip_gradient_norm, {weight: coefficient for weight, coefficient in penalties})
        return
    for weight, coefficient in penalties:
        weight.grad.add_(weight.detach(), alpha=coefficient)
    if clip_gradient_value > 0:
        nn.utils.clip_grad_value_(model.parameters(), clip_gradient_value)
    if clip_gradient_norm > 0:
        clip_each_gradient_norm(model.parameters(), clip_gradient_norm)
    scaler.step(optimizer)
    scaler.update()


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


def fused_adam_applies(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                       clip_gradient_value: float) -> bool:
    """True for torch.optim.Adam with the options the fused step implements, on float32 CPU weights and dense
    gradients, without loss scaling or clipping by value."""
    if type(optimizer) is not torch.optim.Adam or scaler.is_enabled() or clip_gradient_value > 0:
        return False
    for group in optimizer.param_groups:
        if any(group.get(option, default) != default for option, default in _FUSED_ADAM_OPTIONS.items()):
            return False
        if not all(isinstance(value, float) for value in (group["lr"], *group["betas"])):
            return False
        weights = [weight for weight in group["params"] if weight.grad is not None]
        if any(weight.grad.is_sparse for weight in weights) or not use_fused_kernels(
                *weights, *(weight.grad for weight in weights)):
            return False
    return True


def fused_adam_step(optimizer: torch.optim.Adam, clip_gradient_norm: float,
                    penalties: dict[nn.Parameter, float]) -> None:
    """torch.optim.Adam's step with each gradient g read as g + coefficient x w (its L2 penalty) and scaled to a
    norm of at most `clip_gradient_norm` (0: no clipping): two passes over each weight where the separate steps
    take six. The optimizer state is torch's own (exp_avg, exp_avg_sq, step), so checkpoints are unchanged."""
    for group in optimizer.param_groups:
        beta1, beta2 = group["betas"]
        for weight in group["params"]:
            if weight.grad is None:
                continue
            state = optimizer.state[weight]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(weight, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(weight, memory_format=torch.preserve_format)
            state["step"] += 1
            step = state["step"].item()
            buffers = as_arrays(weight, weight.grad)
            coefficient = penalties.get(weight, 0.0)
            grad_scale = 1.0
            if clip_gradient_norm > 0:
                norm = math.sqrt(sum(over_rows(_kernels.penalized_squared_norm, weight.numel(), *buffers,
                                               coefficient, grain=ELEMENTS_PER_THREAD)))
                grad_scale = clip_gradient_norm / norm if norm > clip_gradient_norm else 1.0
            over_rows(_kernels.adam_update, weight.numel(), *buffers, *as_arrays(state["exp_avg"], state["exp_avg_sq"]),
                      coefficient, grad_scale, 1 - beta1, beta2, 1 - beta2,
                      group["lr"] / (1 - beta1 ** step), math.sqrt(1 - beta2 ** step), group["eps"],
                      grain=ELEMENTS_PER_THREAD)
            for tensor in (weight, state["exp_avg"], state["exp_avg_sq"]):
                torch.autograd.graph.increment_version(tensor)  # written through NumPy, unseen by autograd

