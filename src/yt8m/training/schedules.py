"""Learning-rate schedules by name (`--lr_schedule`): the starter kit's exponential decay (the default), step decay,
cosine with linear warmup, one-cycle, and one's own: a function of the step, a class, or a torch LRScheduler.

A schedule gives the factor of --base_learning_rate at each optimizer step, from the steps and the global examples
done; --lr_halving_patience's halvings multiply it. Being a function of the run's progress, a resume continues it
exactly (a torch LRScheduler is replayed to the resumed step).
"""

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional, Protocol

import torch

from yt8m.config import ComponentSection
from yt8m.fields import setting
from yt8m.plugins.faults import calling, finite_number
from yt8m.plugins.registry import Registry, described
from yt8m.plugins.signature import annotated_hparams, signature_hparams


class Schedule(Protocol):
    """A learning-rate schedule: `factor(step, examples)`, the factor of --base_learning_rate for the optimizer step
    after `step` steps and `examples` global examples."""

    def factor(self, step: int, examples: int) -> float: ...


@dataclass(frozen=True)
class ExponentialHParams:
    learning_rate_decay: float = setting(0.95, "exponential: the learning rate's multiplier per "
                                               "--learning_rate_decay_examples.", above=0, at_most=1)
    learning_rate_decay_examples: int = setting(4000000, "exponential: examples between decays (staircase).",
                                                at_least=1)


class Exponential:
    """The starter kit's tf.train.exponential_decay(staircase=True) over the global examples seen."""

    def __init__(self, hparams: ExponentialHParams = ExponentialHParams(), max_steps: Optional[int] = None):
        self.hparams = hparams

    def factor(self, step: int, examples: int) -> float:
        return float(self.hparams.learning_rate_decay ** (examples // self.hparams.learning_rate_decay_examples))


@dataclass(frozen=True)
class StepHParams:
    step_size: int = setting(10000, "step: optimizer steps between decays.", at_least=1)
    gamma: float = setting(0.1, "step: the learning rate's multiplier at each decay.", above=0, at_most=1)


class Step:
    """Step decay (torch's StepLR, by optimizer steps): gamma ** (step // step_size)."""

    def __init__(self, hparams: StepHParams = StepHParams(), max_steps: Optional[int] = None):
        self.hparams = hparams

    def factor(self, step: int, examples: int) -> float:
        return float(self.hparams.gamma ** (step // self.hparams.step_size))


@dataclass(frozen=True)
class CosineHParams:
    warmup_steps: int = setting(0, "cosine: steps of linear warmup, from base/warmup_steps up to the base rate.",
                                at_least=0)
    decay_steps: Optional[int] = setting(None, "cosine: the steps the rate decays over, warmup included (None: the "
                                               "run's --max_steps).", at_least=1)
    min_factor: float = setting(0.0, "cosine: the rate's floor, as a factor of the base rate.", at_least=0,
                                at_most=1)


def horizon(decay_steps: Optional[int], max_steps: Optional[int], schedule: str) -> int:
    """The steps a schedule decays over: its own decay_steps, else the run's --max_steps."""
    steps = decay_steps or max_steps
    if not steps:
        raise ValueError(f"--lr_schedule {schedule} decays over a number of steps: give --max_steps, or "
                         f"--lr_schedule.decay_steps")
    return steps


class Cosine:
    """Linear warmup, then a half cosine from the base rate to min_factor of it over decay_steps (Loshchilov and
    Hutter 2017's SGDR without restarts; warmup as Goyal et al. 2017); held at the floor after."""

    def __init__(self, hparams: CosineHParams = CosineHParams(), max_steps: Optional[int] = None):
        self.hparams, self.steps = hparams, horizon(hparams.decay_steps, max_steps, "cosine")

    def factor(self, step: int, examples: int) -> float:
        warmup = self.hparams.warmup_steps
        if step < warmup:
            return (step + 1) / warmup
        done = min(1.0, (step - warmup) / max(1, self.steps - warmup))
        floor = self.hparams.min_factor
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done))


@dataclass(frozen=True)
class OneCycleHParams:
    decay_steps: Optional[int] = setting(None, "onecycle: the cycle's steps (None: the run's --max_steps).",
                                         at_least=1)
    pct_start: float = setting(0.3, "onecycle: the share of the cycle spent rising to the base rate.", above=0,
                               below=1)
    div_factor: float = setting(25.0, "onecycle: the start rate is the base rate / div_factor.", at_least=1)
    final_div_factor: float = setting(10000.0, "onecycle: the end rate is the start rate / final_div_factor.",
                                      at_least=1)


class OneCycle:
    """Smith and Topin 2019's one-cycle policy with cosine annealing, as torch's OneCycleLR (three_phase=False) with
    --base_learning_rate as its max_lr: up from base/div_factor, then down to base/(div_factor x final_div_factor)."""

    def __init__(self, hparams: OneCycleHParams = OneCycleHParams(), max_steps: Optional[int] = None):
        self.hparams, self.steps = hparams, horizon(hparams.decay_steps, max_steps, "onecycle")

    def factor(self, step: int, examples: int) -> float:
        start = 1 / self.hparams.div_factor
        end = start / self.hparams.final_div_factor
        peak = self.hparams.pct_start * self.steps - 1  # torch's phase end, in steps counted from 0
        if step <= peak:
            return _cosine_between(start, 1.0, step / peak if peak > 0 else 1.0)
        return _cosine_between(1.0, end, min(1.0, (step - peak) / max(1e-9, self.steps - 1 - peak)))


def _cosine_between(start: float, end: float, done: float) -> float:
    return end + (start - end) / 2 * (1 + math.cos(math.pi * done))


class FunctionSchedule:
    """A schedule written as a function `schedule(step, **hparams)` (examples too where it takes `examples`)
    giving the factor of the base rate."""

    def __init__(self, function: Callable[..., float], hparams: Any, max_steps: Optional[int] = None):
        self.function, self.values = function, dict(vars(hparams)) if hparams is not None else {}
        self.takes_examples = "examples" in inspect.signature(function).parameters

    def factor(self, step: int, examples: int) -> float:
        name = self.function.__qualname__
        given = {"examples": examples} if self.takes_examples else {}
        value = calling(f"lr_schedule {name}", name, functools.partial(self.function, **given, **self.values), step)
        return finite_number(f"lr_schedule {name}", name, value)


class TorchSchedule:
    """A torch LRScheduler class, stepped once per optimizer step on an optimizer of its own at rate 1, so that its
    rate is the factor of the base rate; replayed from step 0 to the step it is first asked (a resume's)."""

    def __init__(self, cls: type, hparams: Any, max_steps: Optional[int] = None):
        self.name = cls.__qualname__
        self.optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        self.scheduler = calling(f"lr_schedule {self.name}", f"{self.name}(optimizer, ...)", cls, self.optimizer,
                                 **vars(hparams))
        self.steps = 0

    def factor(self, step: int, examples: int) -> float:
        while self.steps < step:
            self.optimizer.step()  # no gradient, no change: torch warns of a scheduler stepped before its optimizer
            calling(f"lr_schedule {self.name}", f"{self.name}.step", self.scheduler.step)
            self.steps += 1
        return finite_number(f"lr_schedule {self.name}", f"{self.name}'s rate",
                             self.optimizer.param_groups[0]["lr"])


@dataclass(frozen=True)
class ScheduleEntry:
    """A registered schedule: what builds it from its hyper-parameters and the run's --max_steps, and their
    dataclass."""

    build: Callable[[Any, Optional[int]], Schedule]
    hparams: type


# What a torch LRScheduler is given by the adapter, or left at its default: its other arguments are hyper-parameters.
TORCH_GIVEN = ("optimizer", "last_epoch", "verbose")


def adopt_schedule(name: str, obj: Any) -> ScheduleEntry:
    """What a name or import path finds, as a schedule: a torch LRScheduler class, a class with factor(step,
    examples) taking its hyper-parameters (a dataclass `hparams`, or keyword arguments) and max_steps, or a
    function of the step. A TypeError says what it lacks."""
    if isinstance(obj, type) and issubclass(obj, torch.optim.lr_scheduler.LRScheduler):
        return ScheduleEntry(functools.partial(TorchSchedule, obj), signature_hparams(obj, TORCH_GIVEN))
    if isinstance(obj, type) and callable(getattr(obj, "factor", None)):
        own = annotated_hparams(obj)
        return ScheduleEntry(obj if own else functools.partial(_by_keyword, obj),
                             own or signature_hparams(obj, ("max_steps",)))
    if inspect.isfunction(obj):
        parameters = list(inspect.signature(obj).parameters)
        if parameters[:1] != ["step"]:
            raise TypeError(f"{obj.__qualname__} takes ({', '.join(parameters)}), but a schedule is called as "
                            "(step[, examples], **hyper-parameters) and returns the factor of --base_learning_rate: "
                            "name its first argument step")
        return ScheduleEntry(functools.partial(FunctionSchedule, obj), signature_hparams(obj, ("step", "examples")))
    raise TypeError(f"{described(obj)} is not a learning-rate schedule: a schedule is a function of the step giving "
                    "the factor of --base_learning_rate, a class with factor(step, examples), or a torch LRScheduler "
                    "class")


def _by_keyword(cls: type, hparams: Any, max_steps: Optional[int]) -> Schedule:
    return cls(max_steps=max_steps, **vars(hparams))


SCHEDULES: Registry[ScheduleEntry] = Registry("learning-rate schedule", "yt8m.lr_schedules", adopt_schedule)
for _name, _builtin in (("exponential", Exponential), ("step", Step), ("cosine", Cosine), ("onecycle", OneCycle)):
    SCHEDULES.add(_name, adopt_schedule(_name, _builtin), _builtin, builtin=True)


@dataclass(frozen=True)
class LRScheduleConfig(ComponentSection):
    """The `lr_schedule` section: the learning rate's schedule and its hyper-parameters (as given; once resolved,
    the schedule's dataclass at its defaults where not given)."""

    name: str = setting("exponential", "The learning rate's schedule, a factor of --base_learning_rate at each "
                                       "step: exponential (the starter kit's staircase decay by examples), step, "
                                       "cosine (with --lr_schedule.warmup_steps), onecycle, or one's own "
                                       "(package.module:name: a function of the step, a class, a torch "
                                       "LRScheduler).", flag="lr_schedule")
    hparams: Any = setting(None, "The schedule's hyper-parameters (YAML mapping); each is also given by its dotted "
                                 "name (--lr_schedule.warmup_steps 500) and, for the built-in schedules, by its own "
                                 "flag (--learning_rate_decay 0.9, --warmup_steps 500).", flag="lr_schedule_hparams")

    SCOPE: ClassVar[str] = "lr_schedule"

    @classmethod
    def registry(cls) -> Registry[Any]:
        return SCHEDULES


def build_schedule(config: LRScheduleConfig, max_steps: Optional[int]) -> Schedule:
    """The schedule a section describes (resolved first where it is not yet), for a run of at most `max_steps`.

    Examples:
        >>> cosine = build_schedule(LRScheduleConfig("cosine", {"warmup_steps": 2}), max_steps=10)
        >>> [round(cosine.factor(step, examples=0), 3) for step in (0, 1, 2, 6, 10)]
        [0.5, 1.0, 1.0, 0.5, 0.0]
        >>> def halving(step, every: int = 100):  # one's own: registered, or by import path (module:halving)
        ...     return 0.5 ** (step // every)
        >>> SCHEDULES.add("halving", adopt_schedule("halving", halving), halving)
        >>> build_schedule(LRScheduleConfig("halving", {"every": 3}), max_steps=None).factor(7, examples=0)
        0.25
        >>> SCHEDULES.remove("halving")
    """
    section = config.resolved()
    return SCHEDULES.get(section.name, "--lr_schedule").build(section.hparams, max_steps)
