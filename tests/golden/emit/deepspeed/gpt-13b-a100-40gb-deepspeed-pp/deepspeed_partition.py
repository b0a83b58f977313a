"""Pipeline split of plan #1, written by `planner emit` (import it in train.py).

DeepSpeed's PipelineModule puts layer specs parts[s] .. parts[s+1]-1 on pipeline stage s
(deepspeed/runtime/pipe/module.py). Its own partition methods balance layer counts or parameters; this module gives
the planned split instead:

    from deepspeed_partition import pipeline_module_class, topology
    PlannedPipelineModule = pipeline_module_class(num_before=1, num_after=2)
    model = PlannedPipelineModule(layers=specs, topology=topology(), loss_fn=loss_fn)

``specs`` is your layer list: ``num_before`` specs before the transformer layers (the embedding), the transformer
layers (40), then ``num_after`` specs (final norm, output head). The topology puts pipe outermost
(PipeModelDataParallelTopology axes pipe, data, model), so stage s runs on the node block the plan placed it on.
With TP > 1 the transformer layers themselves must be tensor-parallel (Megatron-style layers over the topology's
model-parallel group, with sequence parallelism as SEQUENCE_PARALLEL says).
"""

PP = 6
TP = 2
DP = 2
SEQUENCE_PARALLEL = True
STAGE_LAYERS = (6, 7, 7, 7, 7, 6)  # transformer layers of each pipeline stage


def parts(num_before: int = 1, num_after: int = 2) -> list[int]:
    """PipelineModule.parts: the first spec index of every stage, then the number of specs. Stage 0 also holds the
    ``num_before`` leading specs, the last stage the ``num_after`` trailing ones."""
    bounds = [0]
    for count in STAGE_LAYERS:
        bounds.append(bounds[-1] + count)
    bounds = [num_before + b for b in bounds]
    bounds[0] = 0
    bounds[-1] += num_after
    return bounds


def topology():
    """PipeModelDataParallelTopology(num_pp=PP, num_mp=TP, num_dp=DP) (deepspeed/runtime/pipe/topology.py)."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    return PipeModelDataParallelTopology(num_pp=PP, num_mp=TP, num_dp=DP)


def pipeline_module_class(num_before: int = 1, num_after: int = 2):
    """A PipelineModule subclass whose stages hold STAGE_LAYERS transformer layers each."""
    from deepspeed.runtime.pipe.module import PipelineModule

    class PlannedPipelineModule(PipelineModule):
        def _partition_layers(self, method="uniform"):
            bounds = parts(num_before, num_after)
            if bounds[-1] != len(self._layer_specs):
                raise ValueError(
                    f"deepspeed_partition: {len(self._layer_specs)} layer specs, expected {bounds[-1]} "
                    f"({num_before} + {sum(STAGE_LAYERS)} transformer layers + {num_after})"
                )
            if self.num_stages != PP:
                raise ValueError(f"deepspeed_partition: the module has {self.num_stages} stages, the plan {PP}")
            self.parts = bounds
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=bounds[stage], stop=bounds[stage + 1])

    return PlannedPipelineModule
