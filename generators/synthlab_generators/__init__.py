"""synthlab task generators (the folder `generators/synthlab_generators/`, named as its import name).

One module per task behind one interface (`common.TaskSpec`: a validated params dataclass,
`generate(params, rng) -> Dataset`, `shape(params) -> TaskShape` and every other per-task fact),
collected in the registry `TASKS`; `writer.write_dataset` puts a dataset on disk. `synthlab gen
TASK ...` is built from this registry. This package imports nothing from `synthlab`.

    from synthlab_generators import TASKS, write_dataset
    spec = TASKS["mano"]
    write_dataset(spec, spec.params_cls(L=10, n_train=1000), seed=0, out="data/mano-small")
"""

from synthlab_generators import bios, mano, multihop, reach
from synthlab_generators.common import SPECIAL_TOKENS, Dataset, TaskSpec
from synthlab_generators.writer import write_dataset

TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (mano.SPEC, bios.SPEC, multihop.SPEC, reach.SPEC)}

__all__ = ["SPECIAL_TOKENS", "TASKS", "Dataset", "TaskSpec", "write_dataset"]
