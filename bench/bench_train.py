"""Training examples/s of `yt8m train` against the dense-matmul ceiling of the same step, measured in one run; with
several --kernels settings, each fused CPU kernel's gain: the same run on and off.

The ceiling times only the matmuls a forward+backward step performs (shapes recorded by the profiler; fused
attention counts as the batched matmuls it stands for); the bare loop runs the same model, loss and optimizer step
without input pipeline, logging or checkpoints. Any registered model can be named; frame-level ones train on frames.
Usage: .venv/bin/python bench/bench_train.py [--models LogisticModel,MoeModel,DbofModel] [--steps 20]
       .venv/bin/python bench/bench_train.py --models MoeModel --kernels all --kernels none --kernels=-moe
       .venv/bin/python bench/bench_train.py --models TransformerModel --set transformer_max_frames=32 --steps 3
       .venv/bin/python bench/bench_train.py --models MoeModel --versus 'tasks=[{name: main}]'   # a setting's cost
       .venv/bin/python bench/bench_train.py --models MoeModel,DbofModel --versus compile=true --versus_kernels none
           # the fused CPU kernels (eager) against torch.compile without them
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import yaml

from yt8m.process_settings import configure_training_process

configure_training_process()  # as `yt8m train` does, before torch loads; the ceiling, timed here, gains from it too
import torch  # noqa: E402

from yt8m import kernels  # noqa: E402
from yt8m.config import config_from_dict  # noqa: E402
from yt8m.data.making.synthetic import write_synthetic  # noqa: E402
from yt8m.data.reading.batch import Batch  # noqa: E402
from yt8m.data.reading.dataset import YT8MDataset  # noqa: E402
from yt8m.models import is_frame_level  # noqa: E402
from yt8m.models.config import build_model  # noqa: E402
from yt8m.runtime import autocast, resolve_device, setup_logging  # noqa: E402
from yt8m.tasks.losses import create_loss  # noqa: E402
from yt8m.tasks.taskset import plan_tasks  # noqa: E402
from yt8m.training import TrainConfig, train  # noqa: E402
from yt8m.training.meter import WARMUP_STEPS  # noqa: E402
from yt8m.training.optim import apply_update, build_optimizer, l2_terms  # noqa: E402
from yt8m.training.run import model_of  # noqa: E402
from yt8m.training.stepper import grad_scaler, model_loss  # noqa: E402


def backward_and_update(loss: torch.Tensor, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        scaler: torch.amp.GradScaler, clip_gradient_norm: float, penalties=()) -> None:
    """The bare loop's step: the gradient of one batch's label `loss`, then the trainer's optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    apply_update(model, optimizer, scaler, clip_gradient_norm, 0.0, penalties)


# Each matmul op's operands, in order; a recorded `out=` tensor after them is not one.
MATMUL_OPERANDS = {"aten::mm": 2, "aten::addmm": 3, "aten::addmm_": 3, "aten::bmm": 2, "aten::baddbmm": 3}
ATTENTION = "aten::scaled_dot_product_attention"  # its kernel's backward: a "...scaled_dot_product..._backward" op
# The starter kit under TF 2.x on this machine (issue 4), for scale.
STARTER_KIT = {"LogisticModel": 2600, "MoeModel": 370}


def recorded_matmuls(model: torch.nn.Module, batch: dict, loss_fn) -> list[tuple[str, list[list[int]]]]:
    """(op, input shapes) of every top-level matmul one forward+backward step runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        output = model(batch.features, batch.num_frames)
        loss_fn(output, batch.labels).backward()
    found = []
    for event in prof.events():
        parent, nested = event.cpu_parent, False
        while parent is not None:
            nested = nested or parent.name in MATMUL_OPERANDS or _is_attention(parent.name)
            parent = parent.cpu_parent
        if nested:
            continue
        if event.name in MATMUL_OPERANDS:
            operands = event.input_shapes[:MATMUL_OPERANDS[event.name]]
            found.append((event.name, [list(shape) for shape in operands]))
        elif _is_attention(event.name):
            query, key, value = event.input_shapes[1:4] if "backward" in event.name else event.input_shapes[:3]
            found.extend(attention_matmuls(query, key, value, backward="backward" in event.name))
    return found


def _is_attention(name: str) -> bool:
    return name == ATTENTION or ("scaled_dot_product" in name and name.endswith("_backward"))


def attention_matmuls(query: list[int], key: list[int], value: list[int], backward: bool) -> list:
    """The batched matmuls fused attention of these [batch, heads, length, size] operands stands for: scores
    Q K^T and output P V forward; dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q backward."""
    batch = query[0] * query[1]
    (lq, d), lk, dv = query[2:], key[2], value[3]
    scores = [batch, lq, lk]
    if not backward:
        return [("aten::bmm", [[batch, lq, d], [batch, d, lk]]), ("aten::bmm", [scores, [batch, lk, dv]])]
    return [("aten::bmm", [[batch, lk, lq], [batch, lq, dv]]), ("aten::bmm", [[batch, lq, dv], [batch, dv, lk]]),
            ("aten::bmm", [scores, [batch, lk, d]]), ("aten::bmm", [[batch, lk, lq], [batch, lq, d]])]


def finish(device: torch.device) -> None:
    """Wait for the device's queued work: a CUDA timer must not stop at the launches."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_matmuls(matmuls: list[tuple[str, list[list[int]]]], device: torch.device, repeats: int = 5,
                 dtype: torch.dtype = torch.float32) -> float:
    """Best-of-`repeats` seconds to run the recorded matmuls once each on `device`, on fresh random operands."""
    calls = []
    for name, shapes in matmuls:
        operands = [torch.randn(shape, dtype=dtype, device=device) for shape in shapes if shape]
        op = name.split("::")[1]  # an in-place op (addmm_) is the tensor method, on the first operand
        calls.append((getattr(torch.Tensor if op.endswith("_") else torch, op), operands))
    timings = []
    for _ in range(repeats + 1):
        finish(device)
        started = time.perf_counter()
        for function, operands in calls:
            function(*operands)
        finish(device)
        timings.append(time.perf_counter() - started)
    return min(timings[1:])


def one_batch(config: TrainConfig) -> Batch:
    """The first batch, on the device the trainer would use."""
    batch = next(iter(YT8MDataset(config.data.train_data_pattern, config.features, config.schedule.batch_size)))
    return batch.to(resolve_device(config.runtime.device))


def ceiling_examples_per_sec(config: TrainConfig, dtype: torch.dtype = torch.float32) -> tuple[float, int]:
    """The matmul ceiling with operands of `dtype`: float32, or bfloat16 for the same step under autocast."""
    torch.manual_seed(0)
    device = resolve_device(config.runtime.device)
    model = build_model(config.model, config.features).to(device).train()
    batch = one_batch(config)
    matmuls = recorded_matmuls(model, batch, create_loss(config.loss.name))
    return batch.labels.shape[0] / time_matmuls(matmuls, device, dtype=dtype), len(matmuls)


def bare_step(config: TrainConfig):
    """One step of the model, loss and optimizer on one batch, on the trainer's device, as a function; and the
    batch's size."""
    torch.manual_seed(0)
    device = resolve_device(config.runtime.device)
    # with tasks: the multi-task model and loss
    tasks = plan_tasks(config.tasks, config.main_task(), config.validation.top_n)
    model = model_of(config, tasks).to(device)
    model.train()
    optimizer = build_optimizer(config.optimizer, model.parameters())
    scaler = grad_scaler(config.runtime.mixed_precision, device)
    batch = one_batch(config)
    forward_loss = torch.compile(model_loss) if config.runtime.compile else model_loss
    penalties = l2_terms(model, config.optimizer.regularization_penalty)

    def step() -> None:
        with autocast(device, config.runtime.mixed_precision):
            _, label_loss, loss, _ = forward_loss(model, tasks, batch)
        backward_and_update(loss, model, optimizer, scaler, config.optimizer.clip_gradient_norm,
                            penalties=penalties)
        label_loss.item()

    return step, batch.labels.shape[0]


def bare_loop_examples_per_sec(config: TrainConfig, steps: int = 5) -> float:
    """The same model, loss and optimizer step on one batch in a bare loop: no input, logging or checkpoints."""
    step, batch_size = bare_step(config)
    step(), step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch_size / (time.perf_counter() - started)


def kernel_names(setting: str) -> list[str]:
    """--kernels values: all, none, a comma list of kernels.KERNELS, or -NAME for all but that one."""
    if setting in ("all", "none"):
        return list(kernels.KERNELS) if setting == "all" else []
    if setting.startswith("-"):
        return [name for name in kernels.KERNELS if name != setting[1:]]
    return setting.split(",")


def use_kernels(setting: str) -> None:
    kernels.set_enabled_kernels(kernel_names(setting))


def with_kernels(step, setting: str):
    """`step` run with the kernels of `setting` (a compiled step keeps those it first traced)."""
    def run() -> None:
        use_kernels(setting)
        step()
    return run


def interleaved_step_ms(config: TrainConfig, settings: list[str], steps: int) -> dict[str, dict[str, float]]:
    """Bare-loop step times (ms) of each kernel setting taken in turns, one step each, on one model."""
    step, _ = bare_step(config)
    return interleaved_ms({setting: with_kernels(step, setting) for setting in settings}, steps)


def interleaved_ms(steps_by_name: dict, steps: int) -> dict[str, dict[str, float]]:
    """Step times (ms) of several step functions taken in turns, one step each: a load swing of the shared machine
    falls on all alike. Per function the median, min and max of the wall time, and the median CPU time of the
    process (all its threads): less swayed by other processes on a shared machine."""
    wall: dict[str, list[float]] = {name: [] for name in steps_by_name}
    cpu: dict[str, list[float]] = {name: [] for name in steps_by_name}
    for round_ in range(steps + 1):
        for name, step in steps_by_name.items():
            started, started_cpu = time.perf_counter(), time.process_time()
            step()
            if round_:  # the first round warms up each function
                wall[name].append(1000 * (time.perf_counter() - started))
                cpu[name].append(1000 * (time.process_time() - started_cpu))
    return {name: {"median": round(statistics.median(ms), 1), "min": round(min(ms), 1), "max": round(max(ms), 1),
                   "cpu_median": round(statistics.median(cpu[name]), 1)} for name, ms in wall.items()}


def bench_model(model: str, pattern: str, work_dir: str, args: argparse.Namespace) -> dict:
    frame = is_frame_level(model)
    values = {**dict(
        train_data_pattern=pattern, train_dir=os.path.join(work_dir, model), model=model,
        feature_names="rgb,audio" if frame else "mean_rgb,mean_audio", feature_sizes="1024,128",
        frame_features=frame, batch_size=args.frame_batch_size if frame else args.batch_size,
        num_epochs=1000, max_steps=WARMUP_STEPS + args.steps, export_model_steps=10 ** 9,
        num_readers=args.num_readers, cache_in_memory=args.cache and not frame, start_new_model=True,
        compile=args.compile, mixed_precision=args.mixed_precision, log_every_steps=5), **settings_given(args.set)}
    config = train_config(values)
    # The machine is shared and its load swings within seconds: the three measures alternate for a few
    # rounds and each keeps its best round (the least disturbed), as timeit does.
    rounds = {"trainer": [], "bare": [], "ceiling": [], "input_wait": []}
    settings = args.kernels or ["all"]
    by_setting = {setting: {"trainer": [], "bare": []} for setting in settings}
    versus = {text: train_config({**values, "train_dir": f"{config.checkpoints.train_dir}-versus{index}",
                                  **settings_given([text])})
              for index, text in enumerate(args.versus)}
    by_versus: dict[str, list[float]] = {text: [] for text in args.versus}
    for round_index in range(args.rounds):
        use_kernels(settings[0])
        ceiling, matmuls = ceiling_examples_per_sec(config)
        if config.runtime.mixed_precision:
            rounds.setdefault("bfloat16_ceiling", []).append(round(ceiling_examples_per_sec(config, torch.bfloat16)[0], 1))
        rounds["ceiling"].append(round(ceiling, 1))
        for setting in settings:
            use_kernels(setting)
            if setting == settings[0] and versus:  # back to back, in turns first and last: no order favours one
                runs = [("", config), *versus.items()]
                for text, run_config in runs if round_index % 2 == 0 else runs[::-1]:
                    use_kernels(args.versus_kernels if text else setting)
                    if text:
                        by_versus[text].append(train(run_config)["examples_per_sec"])
                    else:
                        summary = train(config)
            else:
                summary = train(config)
            by_setting[setting]["trainer"].append(summary["examples_per_sec"])
            by_setting[setting]["bare"].append(round(bare_loop_examples_per_sec(config), 1))
            if setting == settings[0]:
                rounds["input_wait"].append(summary["input_wait_fraction"])
    rounds["trainer"], rounds["bare"] = by_setting[settings[0]]["trainer"], by_setting[settings[0]]["bare"]
    trainer, bare, ceiling = max(rounds["trainer"]), max(rounds["bare"]), max(rounds["ceiling"])
    result = {"model": model, "batch_size": config.schedule.batch_size, "cache_in_memory": config.data.cache_in_memory,
              "compile": config.runtime.compile, "mixed_precision": config.runtime.mixed_precision,
              "num_readers": config.data.num_readers, "matmuls_per_step": matmuls,
              "trainer_examples_per_sec": trainer, "bare_loop_examples_per_sec": bare,
              "matmul_ceiling_examples_per_sec": ceiling, "input_wait_fraction": min(rounds["input_wait"]),
              "trainer_over_ceiling": round(trainer / ceiling, 3), "trainer_over_bare_loop": round(trainer / bare, 3),
              "rounds": rounds}
    if config.runtime.mixed_precision:
        result["bfloat16_matmul_ceiling_examples_per_sec"] = max(rounds["bfloat16_ceiling"])
        result["trainer_over_bfloat16_ceiling"] = round(trainer / max(rounds["bfloat16_ceiling"]), 3)
    if model in STARTER_KIT:
        result["starter_kit_tf2_examples_per_sec"] = STARTER_KIT[model]
    if versus:  # each round trains both back to back, in alternating order: the ratio of the rounds' medians
        steps = {"base": with_kernels(bare_step(config)[0], settings[0]),
                 **{text: with_kernels(bare_step(changed)[0], args.versus_kernels) for text, changed in versus.items()}}
        step_ms = interleaved_ms(steps, 4 * args.steps)
        result["versus"] = {text: {"trainer_examples_per_sec": runs, "over_base_median": round(
            statistics.median(runs) / statistics.median(rounds["trainer"]), 4),
            "interleaved_bare_step_ms": step_ms[text], "base_bare_step_ms": step_ms["base"],
            "bare_step_over_base": round(step_ms[text]["median"] / step_ms["base"]["median"], 4)}
            for text, runs in by_versus.items()}
    if len(settings) > 1:
        result["kernels"] = {"settings": by_setting,
                             "interleaved_bare_step_ms": interleaved_step_ms(config, settings, args.steps)}
    return result


def train_config(values: dict) -> TrainConfig:
    """The TrainConfig of flat `yt8m train` field values, as the command reads them (train checks it)."""
    return config_from_dict(TrainConfig, values, source="bench_train")


def settings_given(items: list[str]) -> dict:
    """NAME=VALUE pairs (--set, --versus) as `yt8m train` fields (values read as YAML: 64, 0.1, true, mean, lists)."""
    pairs = [item.partition("=") for item in items]
    return {name: yaml.safe_load(value) for name, _, value in pairs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="LogisticModel,MoeModel,DbofModel")
    parser.add_argument("--steps", type=int, default=20, help="Timed steps per model, after the warm-up steps.")
    parser.add_argument("--batch_size", type=int, default=1024, help="Video-level batch size.")
    parser.add_argument("--frame_batch_size", type=int, default=64, help="Frame-level models' batch size.")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="A `yt8m train` field for every model benched, e.g. transformer_max_frames=32.")
    parser.add_argument("--videos", type=int, default=8192, help="Synthetic training videos per kind.")
    parser.add_argument("--num_readers", type=int, default=1)
    parser.add_argument("--cache", action=argparse.BooleanOptionalAction, default=True,
                        help="Video level: serve the decoded set from RAM (--no-cache streams from the shards).")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating measurement rounds; the best counts.")
    parser.add_argument("--compile", action="store_true", help="Train with --compile (torch.compile).")
    parser.add_argument("--mixed_precision", action="store_true",
                        help="Train with --mixed_precision (bfloat16 autocast); also reports the bfloat16 ceiling.")
    parser.add_argument("--work_dir", default=None, help="Where data and train dirs go (default: a temp dir).")
    parser.add_argument("--versus", action="append", default=[], metavar="NAME=VALUE",
                        help="Also train with this setting changed, back to back with the base run in every round (the order "
                             "alternating); reports its trainer examples/s, the ratio of the medians to the base, "
                             "and both bare steps taken in turns (e.g. tasks=[{name: main}]).")
    parser.add_argument("--kernels", action="append", default=None,
                        help="Fused CPU kernels to use: all (the default), none, a comma list of "
                             f"{', '.join(kernels.KERNELS)}, or -NAME for all but NAME. Given more than once, the "
                             "settings take turns in each round and in an interleaved bare loop (kernel gains).")
    parser.add_argument("--versus_kernels", default="all",
                        help="The fused CPU kernels the --versus runs use (the base uses --kernels'), e.g. none with "
                             "--versus compile=true: the kernels against torch.compile's own code.")
    args = parser.parse_args()
    if args.kernels and len(args.kernels) > 1 and args.compile:
        parser.error("--kernels comparisons run without --compile: a compiled graph keeps the kernels it traced")
    setup_logging()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="yt8m-bench-train-")
    results = []
    for model in args.models.split(","):
        kind = "frame" if is_frame_level(model) else "video"
        videos = args.videos // 8 if kind == "frame" else args.videos
        data_dir = os.path.join(work_dir, "data")
        if not os.path.isdir(os.path.join(data_dir, kind)):
            write_synthetic(data_dir, kind=kind, num_classes=3862, train_videos=videos, validate_videos=0,
                            test_videos=0, shards=8)
        results.append(bench_model(model, os.path.join(data_dir, kind, "train-*"), work_dir, args))
        print(json.dumps(results[-1]), flush=True)
    print("\nmodel           batch  compile  trainer ex/s  bare loop  ceiling ex/s  trainer/ceiling  "
          "trainer/bare  input wait", file=sys.stderr)
    for r in results:
        print(f"{r['model']:<15} {r['batch_size']:>5}  {str(r['compile']):>7}  {r['trainer_examples_per_sec']:>12.0f}  "
              f"{r['bare_loop_examples_per_sec']:>9.0f}  {r['matmul_ceiling_examples_per_sec']:>12.0f}  "
              f"{r['trainer_over_ceiling']:>15.0%}  {r['trainer_over_bare_loop']:>12.0%}  "
              f"{r['input_wait_fraction']:>10.1%}", file=sys.stderr)
    for r in results:
        for setting, ms in r.get("kernels", {}).get("interleaved_bare_step_ms", {}).items():
            print(f"{r['model']:<15} --kernels {setting:<22} bare step {ms['median']:.1f} ms median "
                  f"({ms['min']:.1f}-{ms['max']:.1f}), CPU {ms['cpu_median']:.1f} ms, trainer {min(r['kernels']['settings'][setting]['trainer']):.0f}-"
                  f"{max(r['kernels']['settings'][setting]['trainer']):.0f} ex/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
