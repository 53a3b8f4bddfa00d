"""Components of one's own against the CLI (`--model pkg.mod:Name`, `--label_loss`, `--metrics`, `--best_metric`,
installed packages' entry points): a module that does not import, an attribute it lacks, an entry point clashing
with a built-in, a class or function breaking the contract (some only show at the first batch), a metric argument
that does not parse, a misspelt name, an export whose 0-frame check video gives nan. Each is one line naming what
is wrong and what to do, from a process whose working directory holds the user's modules, as a user runs it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_outcome import yt8m, yt8m_env  # noqa: F401  (fixtures)

from workflow_fixtures import FEATURE_SIZES, NUM_CLASSES, tiny_data  # noqa: F401  (fixture)
from yt8m.data.making.synthetic import write_synthetic

pytestmark = pytest.mark.hostile

MODELS = '''
import torch
from torch import nn


class Good(nn.Module):
    def __init__(self, feature_size, num_classes, hidden: int = 8):
        super().__init__()
        self.linear = nn.Linear(feature_size, num_classes)

    def forward(self, features):
        return self.linear(features)


class NoClasses(nn.Module):
    def __init__(self, feature_size, hidden: int = 8):
        super().__init__()

    def forward(self, features):
        return features


class ThreeArgs(nn.Module):
    def __init__(self, feature_size, num_classes):
        super().__init__()

    def forward(self, features, num_frames, mask):
        return features


class NoDefault(nn.Module):
    def __init__(self, feature_size, num_classes, hidden):
        super().__init__()

    def forward(self, features):
        return features


class WrongShape(nn.Module):
    def __init__(self, feature_size, num_classes):
        super().__init__()
        self.linear = nn.Linear(feature_size, num_classes + 1)

    def forward(self, features):
        return self.linear(features)


class ReturnsDict(nn.Module):
    def __init__(self, feature_size, num_classes):
        super().__init__()
        self.linear = nn.Linear(feature_size, num_classes)

    def forward(self, features):
        return {"logits": self.linear(features)}


class RaisesInForward(nn.Module):
    def __init__(self, feature_size, num_classes):
        super().__init__()
        self.linear = nn.Linear(feature_size, num_classes)

    def forward(self, features):
        return self.linear(features.T)


def a_function(features):
    return features
'''

LOSSES = '''
def swapped(labels, output):
    return output["logits"].sum()


def per_video(output, labels, label_weights=None):
    return output["logits"].sum(dim=1)


def raises(output, labels, scale: float = 1.0):
    return {"loss": 1}["total"]
'''

METRICS = '''
class F1:
    higher_is_better = True

    def __init__(self, num_classes, threshold: float = 0.5):
        self.count = 0

    def update(self, predictions, labels):
        self.count += 1

    def compute(self):
        return 0.0

    def merge(self, other):
        self.count += other.count


class NoMerge:
    higher_is_better = True

    def __init__(self, num_classes):
        pass

    def update(self, predictions, labels):
        pass

    def compute(self):
        return 0.0


class NoDirection:
    def __init__(self, num_classes):
        pass

    def update(self, predictions, labels):
        pass

    def compute(self):
        return 0.0

    def merge(self, other):
        pass
'''

# A frame-level attention pooling whose masked softmax over a video without frames is nan (every score -inf).
ATTENTION = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, feature_size, num_classes):
        super().__init__()
        self.score = nn.Linear(feature_size, 1)
        self.out = nn.Linear(feature_size, num_classes)

    def forward(self, features, num_frames):
        scores = self.score(features).squeeze(-1)
        real = torch.arange(features.shape[1]) < num_frames[:, None]
        weights = torch.softmax(scores.masked_fill(~real, float("-inf")), dim=1)
        return self.out((weights.unsqueeze(-1) * features).sum(dim=1))
'''

BROKEN = {
    "raises_importerror": "from torch import no_such_name\n",
    "needs_a_dependency": "import frobnicate_not_installed\n",
    "bad_syntax": "def forward(self:\n    pass\n",
    "undefined_name": "SIZE = 4\nWIDTH = SIZE * undefined_width\n",
}


@pytest.fixture
def user_dir(tmp_path) -> Path:
    """The user's working directory: their modules of models, losses and metrics."""
    for name, text in {"mymodels": MODELS, "mylosses": LOSSES, "mymetrics": METRICS, "attention": ATTENTION,
                       **BROKEN}.items():
        (tmp_path / f"{name}.py").write_text(text)
    return tmp_path


def train(yt8m, user_dir: Path, data: dict, *flags: str, env=None):
    """`yt8m train` of the tiny video-level data in `user_dir`, one epoch."""
    return yt8m("train", "--train_data_pattern", data["train_pattern"], "--train_dir", str(user_dir / "run"),
                "--feature_names", "mean_rgb,mean_audio", "--feature_sizes", ",".join(map(str, FEATURE_SIZES)),
                "--num_classes", str(NUM_CLASSES), "--batch_size", "32", "--num_epochs", "1", "--num_readers", "0",
                *flags, cwd=str(user_dir), env=env, timeout=120)


def refused_before_training(outcome, user_dir: Path, *fragments: str) -> str:
    """One line naming every fragment, the train dir untouched (a config's problem is found before it is)."""
    line = outcome.assert_clean_error(*fragments)
    assert not (user_dir / "run").exists()
    return line


@pytest.mark.parametrize("module, fragments", [
    ("raises_importerror", ["ImportError: cannot import name 'no_such_name' from 'torch'",
                            "raises_importerror.py:1"]),
    ("needs_a_dependency", ["ModuleNotFoundError: No module named 'frobnicate_not_installed'",
                            "needs_a_dependency.py:1"]),
    ("bad_syntax", ["SyntaxError: ", "bad_syntax.py, line 1"]),
    ("undefined_name", ["NameError: name 'undefined_width' is not defined", "undefined_name.py:2"]),
])
def test_a_module_that_does_not_import_is_named_with_its_exception_and_line(yt8m, user_dir, tiny_data, module,
                                                                           fragments):
    outcome = train(yt8m, user_dir, tiny_data, "--model", f"{module}:Model")
    refused_before_training(outcome, user_dir, f"--model {module}:Model: cannot import module {module!r}",
                            *fragments)


def test_a_module_that_is_nowhere_says_where_yt8m_looked(yt8m, user_dir, tiny_data):
    outcome = train(yt8m, user_dir, tiny_data, "--model", "no_such_module:Model")
    refused_before_training(outcome, user_dir, "cannot import module 'no_such_module'",
                            "ModuleNotFoundError: No module named 'no_such_module'",
                            f"the working directory ({user_dir})", "PYTHONPATH")


@pytest.mark.parametrize("path, fragments", [
    ("mymodels:Goood", ["--model mymodels:Goood: module 'mymodels'", "has no attribute 'Goood'; did you mean 'Good'?"]),
    ("mymodels:Nothing", ["--model mymodels:Nothing: module 'mymodels'", "mymodels.py) has no attribute 'Nothing'"]),
])
def test_an_attribute_the_module_lacks_is_named(yt8m, user_dir, tiny_data, path, fragments):
    refused_before_training(train(yt8m, user_dir, tiny_data, "--model", path), user_dir, *fragments)


def test_an_entry_point_clashing_with_a_built_in_names_both(yt8m, user_dir, tiny_data, tmp_path_factory):
    """An installed package (its dist-info on the path, as pip leaves it) declaring a model named LogisticModel."""
    site = tmp_path_factory.mktemp("site")
    info = site / "clash_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: clash_plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[yt8m.models]\nLogisticModel = clash_models:Clash\n")
    (site / "clash_models.py").write_text(MODELS.replace("class Good(", "class Clash("))
    env = yt8m_env()
    env["PYTHONPATH"] += os.pathsep + str(site)
    outcome = train(yt8m, user_dir, tiny_data, "--model", "LogisticModel", env=env)
    outcome.assert_clean_error("entry point LogisticModel = clash_models:Clash (yt8m.models, package clash_plugins)",
                               "the model name 'LogisticModel' is taken by the built-in model LogisticModel "
                               "(yt8m.models.video:LogisticModel)", "rename the entry point")
    # A command that does not name it works, with the warning.
    other = train(yt8m, user_dir, tiny_data, "--model", "MoeModel", env=env)
    assert other.status == 0 and "rename the entry point (left out: a command naming LogisticModel fails" in \
        other.err


@pytest.mark.parametrize("flags, fragments", [
    (["--model", "mymodels:NoClasses"],
     ["--model mymodels:NoClasses: NoClasses.__init__ takes (feature_size, hidden)",
      "NoClasses(feature_size=..., num_classes=..., **hyper-parameters)", "add the argument num_classes"]),
    (["--model", "mymodels:ThreeArgs"],
     ["--model mymodels:ThreeArgs: ThreeArgs.forward takes (features, num_frames, mask)",
      "forward(features) for video-level input or forward(features, num_frames) for frames"]),
    (["--model", "mymodels:NoDefault"],
     ["--model mymodels:NoDefault: NoDefault.__init__'s argument hidden needs a default",
      "write hidden: TYPE = DEFAULT"]),
    (["--model", "mymodels:a_function"],
     ["--model mymodels:a_function: function a_function is not a model: a model is an nn.Module class"]),
    (["--label_loss", "mylosses:swapped"],
     ["--label_loss mylosses:swapped: swapped takes (labels, output), but a loss is called as (output, labels[, "
      "label_weights])", "name its first two arguments output and labels"]),
    (["--metrics", "mymetrics:NoMerge"],
     ["--metrics mymetrics:NoMerge: NoMerge is not a metric: it lacks the method merge"]),
    (["--best_metric", "mymetrics:NoMerge"],
     ["--best_metric mymetrics:NoMerge: NoMerge is not a metric: it lacks the method merge"]),
    (["--metrics", "mymetrics:NoDirection"],
     ["--metrics mymetrics:NoDirection: NoDirection is not a metric: it lacks the class attribute higher_is_better "
      "= True or False"]),
], ids=["init without num_classes", "forward of 3 args", "hyper-parameter without default", "a function as model",
        "loss of (labels, output)", "metric without merge", "best metric without merge",
        "metric without higher_is_better"])
def test_a_component_breaking_the_contract_is_refused_before_training(yt8m, user_dir, tiny_data, flags, fragments):
    outcome = train(yt8m, user_dir, tiny_data, *flags)
    line = refused_before_training(outcome, user_dir, *fragments)
    assert "0x" not in line  # no object addresses


@pytest.mark.parametrize("model, returned", [
    ("WrongShape", "a tensor of shape [32, 13]"),
    ("ReturnsDict", "a dict (keys 'logits')"),
])
def test_a_forward_returning_other_than_logits_is_one_line_at_the_first_batch(yt8m, user_dir, tiny_data, model,
                                                                              returned):
    outcome = train(yt8m, user_dir, tiny_data, "--model", f"mymodels:{model}")
    outcome.assert_clean_error(f"{model}.forward returned {returned}, expected a tensor of logits [batch, classes] "
                               f"= [32, {NUM_CLASSES}]", "return one logit per class")


def test_a_loss_returning_a_value_per_video_is_one_line_at_the_first_batch(yt8m, user_dir, tiny_data):
    outcome = train(yt8m, user_dir, tiny_data, "--label_loss", "mylosses:per_video")
    outcome.assert_clean_error("loss per_video returned a tensor of shape [32]: a loss returns the batch's loss, "
                               "a scalar tensor")


@pytest.mark.parametrize("flags, fragments", [
    (["--model", "mymodels:RaisesInForward"],
     ["model RaisesInForward: RaisesInForward.forward raised RuntimeError: mat1 and mat2 shapes cannot be multiplied",
      "(at "]),
    (["--label_loss", "mylosses:raises"], ["loss raises: raises raised KeyError: 'total' (at ", "mylosses.py:"]),
], ids=["model", "loss"])
def test_a_model_or_loss_raising_at_the_first_batch_is_one_line_naming_it(yt8m, user_dir, tiny_data, flags,
                                                                           fragments):
    train(yt8m, user_dir, tiny_data, *flags).assert_clean_error(*fragments)


@pytest.mark.parametrize("metric, fragments", [
    ("mymetrics:F1(treshold=0.5)", ["--metrics metric 'mymetrics:F1(treshold=0.5)': mymetrics:F1 takes no argument "
                                    "'treshold'; did you mean 'threshold'? (its arguments: threshold)"]),
    ("mymetrics:F1(threshold=0.5", ["--metrics metric 'mymetrics:F1(threshold=0.5'",
                                    "write NAME or NAME(arg=value, ...)"]),
    ("mymetrics:F1(threshold)", ["'threshold' is not arg=value"]),
    ("mymetrics:F1(threshold=high)", ["'threshold' expects float, got 'high'"]),
])
def test_a_metric_argument_that_does_not_parse_or_is_unknown(yt8m, user_dir, tiny_data, metric, fragments):
    refused_before_training(train(yt8m, user_dir, tiny_data, "--metrics", metric), user_dir, *fragments)


@pytest.mark.parametrize("flags, fragments", [
    (["--model", "Logistc"], ["--model 'Logistc' is not a model; did you mean 'LogisticModel'?",
                              "one of your own: package.module:Name"]),
    (["--label_loss", "CrossEntropy"], ["--label_loss 'CrossEntropy' is not a loss; did you mean "
                                        "'CrossEntropyLoss'?"]),
    (["--metrics", "gapp"], ["--metrics 'gapp' is not a metric; did you mean 'gap'?"]),
    (["--best_metric", "hit_at_1"], ["--best_metric 'hit_at_1' is not a metric; did you mean 'hit_at_one'?"]),
])
def test_an_unknown_name_suggests_the_nearest(yt8m, user_dir, tiny_data, flags, fragments):
    refused_before_training(train(yt8m, user_dir, tiny_data, *flags), user_dir, *fragments)


@pytest.fixture(scope="module")
def frame_data(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("frame_data")
    write_synthetic(str(root), kind="frame", num_classes=NUM_CLASSES, train_videos=32, validate_videos=8,
                    test_videos=8, shards=1, feature_sizes=FEATURE_SIZES, min_frames=2, max_frames=6)
    return str(root / "frame" / "train-*.tfrecord")


def test_an_export_whose_0_frame_check_video_gives_nan_names_that_video(yt8m, user_dir, frame_data):
    """Training never feeds a video without frames here; the export's check does, and the softmax gives nan."""
    trained = yt8m("train", "--train_data_pattern", frame_data, "--train_dir", str(user_dir / "run"),
                   "--frame_features", "--feature_names", "rgb,audio",
                   "--feature_sizes", ",".join(map(str, FEATURE_SIZES)), "--num_classes", str(NUM_CLASSES),
                   "--batch_size", "16", "--num_epochs", "1", "--num_readers", "0", "--model", "attention:Attention",
                   cwd=str(user_dir), timeout=120)
    trained.assert_success()
    outcome = yt8m("export", "--train_dir", str(user_dir / "run"), "--output", str(user_dir / "export"),
                   cwd=str(user_dir), timeout=120)
    outcome.assert_clean_error("differ from torch's by nan", "on the check's video with 0 frames",
                               "a model must give finite outputs for a video without frames: mask with num_frames")
    assert not (user_dir / "export" / "metadata.json").exists()
