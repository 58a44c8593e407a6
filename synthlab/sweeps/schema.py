"""The columns of a sweep's results table (`results.csv`), each family named once.

A family is one column (`accuracy`) or one per value of its key (`acc_step_<t>`: t = 1..T). Each
names its type, the stage that writes it (`driver`: the sweep driver, synthlab.sweeps.driver; `describe`: what was
trained, whatever the grid axes were; the others: a stage of `synthlab.sweeps.lab_runner`) and what it means.
Besides these, every grid axis that is not a descriptor is a column under its own name
(`train.lr`). `synthlab columns` prints this table; results, plots and reports read names here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from synthlab_generators import TASKS

_KEY = re.compile(r"<(\w+)>")
_INTEGER_KEYS = {"t", "i", "j", "k"}  # steps and depths; the others (groups, attributes) are labels


@dataclass(frozen=True)
class Family:
    """Columns `pattern` (placeholders in <>) of one `type` (int, float, str), written by `writer`."""

    pattern: str
    type: str
    writer: str
    meaning: str

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(_KEY.findall(self.pattern))

    @property
    def regex(self) -> re.Pattern:
        """Matches the family's columns; its groups are the key's values."""
        parts = _KEY.split(self.pattern)  # text, key, text, key, ..., text
        body = "".join(
            re.escape(p) if n % 2 == 0 else (r"(\d+)" if p in _INTEGER_KEYS else "(.+)") for n, p in enumerate(parts)
        )
        return re.compile(f"^{body}$")

    def name(self, *values) -> str:
        """The column for the key's values: ACC_STEP.name(3) == "acc_step_3"."""
        if len(values) != len(self.key):
            raise ValueError(f"{self.pattern} takes {len(self.key)} value(s), got {len(values)}")
        it = iter(values)
        return _KEY.sub(lambda _: str(next(it)), self.pattern)

    def match(self, column: str) -> tuple[str, ...] | None:
        """The key's values of `column` (() for a single column), None if not of this family."""
        found = self.regex.match(column)
        return None if found is None else found.groups()


def _families(writer: str, *rows: tuple[str, str, str]) -> list[Family]:
    return [Family(pattern, kind, writer, meaning) for pattern, kind, meaning in rows]


_DATA_COLUMNS = dict.fromkeys(c for spec in TASKS.values() for c in dict(spec.data_columns).values())

SCHEMA: tuple[Family, ...] = (
    *_families(
        "driver",
        ("point_id", "str", "the point's id: a hash of its resolved configuration"),
        ("experiment", "str", "the experiment's name"),
        ("preset", "str", "the preset (smoke, cpu, gpu)"),
        ("wall_s", "float", "seconds of wall time over every attempt at the point"),
        ("run_dir", "str", "the folder of the point's trained model"),
    ),
    *_families(
        "describe",
        ("model", "str", "the model's shape: '2x6' (layers x loops) or '1+2x4+1 concat' (sandwich)"),
        ("loops", "int", "recurrent steps the model was trained with"),
        ("d_model", "int", "model width"),
        ("seed", "int", "the training seed (initial weights, data order)"),
        ("data_seed", "int", "the seed of the generated data"),
        *((c, "float", "a generator parameter that describes the data") for c in _DATA_COLUMNS),
    ),
    *_families(
        "train",
        ("train_steps", "int", "optimizer steps trained"),
        ("tokens", "int", "real (non-padding) tokens trained on"),
        ("train_loss", "float", "the training objective, mean of the last logged 10% of steps"),
        ("loss", "float", "the same as train_loss (the column plots and fits read)"),
        ("train_s", "float", "seconds of training, from the logged tokens/s"),
        ("model_reused", "int", "1: the trained model was there already (wall_s has no training)"),
        ("stopped_at_step", "int", "the step at which the run met train.stop_when and ended (blank: not met)"),
        ("params", "int", "unique parameters"),
        ("params_nonemb", "int", "parameters outside the embeddings"),
        ("train_flops", "float", "training FLOPs (3 x forward, at the trained row length)"),
    ),
    *_families(
        "gate",
        ("gate_steps", "int", "Ouro stage II steps (the exit gate alone)"),
        ("gate_loss", "float", "Ouro stage II objective at the end"),
        ("gate_s", "float", "seconds of stage II training"),
    ),
    *_families(
        "eval",
        ("accuracy", "float", "exact-match answer accuracy (the exit or KV strategy's, if one is set)"),
        ("accuracy_at_trained_depth", "float", "accuracy read out at the trained number of steps"),
        ("accuracy_all_steps", "float", "with an exit rule: accuracy at the last step"),
        ("accuracy_teacher_forced", "float", "with a KV strategy: teacher-forced accuracy"),
        ("answer_loss", "float", "answer-token loss at the last step (nats/token)"),
        ("eval_steps", "int", "recurrent steps evaluated"),
        ("n_test", "int", "test examples scored"),
        ("groups_at_step", "int", "the step at which the per-group columns are read out"),
        ("acc_step_<t>", "float", "accuracy read out after recurrent step t"),
        ("agree_<i>_<j>", "float", "share of answers on which steps i and j agree"),
        ("strategy", "str", "the exit rule's kind (static, diff, kl, q)"),
        ("threshold", "float", "the exit rule's threshold"),
        ("mean_exit_step", "float", "mean step at which the exit rule stops"),
        ("train_acc_<g>", "float", "accuracy on a sample of training prompts of group g"),
        ("train_answer_loss_<g>", "float", "answer loss on training prompts of group g"),
        ("train_n_<g>", "int", "training prompts of group g scored"),
        ("acc_<g>", "float", "held-out accuracy of group g (e.g. l2: Mano length 2; h1: one hop)"),
        ("answer_loss_<g>", "float", "held-out answer loss of group g"),
        ("n_<g>", "int", "held-out prompts of group g scored"),
    ),
    *_families(
        "eval, generate",
        ("kv", "str", "the KV-cache strategy of the accuracy"),
        ("kv_bytes", "float", "KV-cache bytes per sequence under that strategy"),
    ),
    *_families(
        "eval, generate, ouroboros",
        ("outcomes", "str", "per-prompt outcomes (CSV beside the eval JSON), relative to run_dir"),
    ),
    *_families("generate", ("n_answers", "int", "bioS attribute answers generated")),
    *_families(
        "heldout",
        ("eval_loss", "float", "held-out loss at the last recurrent step (nats/token)"),
        ("eval_loss_step_<t>", "float", "held-out loss after recurrent step t"),
        ("eval_tokens", "int", "D: tokens trained on when the scored checkpoint was written"),
        ("eval_checkpoint", "int", "the scored checkpoint's optimizer step"),
        ("eval_n_tokens", "int", "target tokens scored"),
        ("eval_seen", "float", "share of the scored examples that occur verbatim in the training split"),
    ),
    *_families(
        "capacity",
        ("p1", "float", "bioS capacity: probability terms of the estimate (p1)"),
        ("p2", "float", "bioS capacity: probability terms of the estimate (p2)"),
        ("bits", "float", "bits of knowledge stored"),
        ("bits_name", "float", "of them, in the names"),
        ("bits_attributes", "float", "of them, in the attributes"),
        ("bits_<attribute>", "float", "of them, in one attribute (gender, birth_date, ...)"),
        ("max_bits", "float", "the data's information content"),
        ("bits_per_param", "float", "bits over params_capacity"),
        ("bits_per_param_nonemb", "float", "bits over non-embedding parameters"),
        ("fraction_of_max", "float", "bits over max_bits"),
        ("params_capacity", "int", "parameters as the estimate counts them (used embedding rows)"),
        (
            "exposures",
            "float",
            "passes over the data trained for (max_bits / params_capacity: the ceiling of bits_per_param)",
        ),
    ),
    *_families(
        "ouroboros",
        ("trainable_params", "int", "OUROBOROS trainable parameters of the variant"),
        ("ouro_steps", "int", "OUROBOROS training steps"),
        ("ouro_train_loss", "float", "OUROBOROS training loss, mean of the last 10% of steps"),
        ("loss_depth_<k>", "float", "held-out loss of the looped variant at depth k"),
        ("loss_truncated", "float", "held-out loss of the truncated base (no recurrent block)"),
        ("loss_base", "float", "held-out loss of the unmodified base"),
        ("loss_new_depth_<k>", "float", "loss at depth k on people the base never saw (ouroboros.eval_data_seed)"),
        ("loss_new_truncated", "float", "the truncated base's loss on those people"),
        ("loss_new_base", "float", "the unmodified base's loss on those people"),
    ),
)

_BY_PATTERN = {f.pattern: f for f in SCHEMA}
ACC_STEP, AGREE, EVAL_LOSS_STEP = (
    _BY_PATTERN["acc_step_<t>"],
    _BY_PATTERN["agree_<i>_<j>"],
    _BY_PATTERN["eval_loss_step_<t>"],
)
BITS_ATTRIBUTE, LOSS_DEPTH = _BY_PATTERN["bits_<attribute>"], _BY_PATTERN["loss_depth_<k>"]
# Columns that describe what was trained (not measured); a report hides one equal to a grid factor.
DESCRIPTORS = ("kv", "strategy", *(f.pattern for f in SCHEMA if f.writer == "describe"))
# Columns that belong to a row, not to one recurrent step of it (synthlab.sweeps.results_table.step_rows drops them).
PER_STEP = (ACC_STEP, AGREE, EVAL_LOSS_STEP)


def family(column: str) -> Family | None:
    """The family of `column` (a single column before a pattern: `n_test` is not `n_<g>`), None
    for a grid axis or a column this table does not know."""
    if column in _BY_PATTERN:
        return _BY_PATTERN[column]
    return next((f for f in SCHEMA if f.key and f.match(column) is not None), None)


def table() -> str:
    """The schema as aligned text, one family a line, grouped by writer."""
    width = max(len(f.pattern) for f in SCHEMA)
    lines = []
    for f in SCHEMA:
        if not lines or lines[-1][0] != f.writer:
            lines.append((f.writer, f"\n[{f.writer}]"))
        lines.append((f.writer, f"  {f.pattern:<{width}}  {f.type:<5}  {f.meaning}"))
    lines.append(("", "\nand each grid axis that is not a descriptor, under its own name (e.g. train.lr)"))
    return "\n".join(text for _, text in lines).lstrip("\n")
