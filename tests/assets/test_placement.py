"""The one device rule (`assets.ray_task.placement`) on fake cluster resources: a model task asks for a
GPU (or an equal share) whenever the cluster has one, and its CPUs come from the GPU nodes."""

import pytest

from assets.ray_task import placement

CPU_BOX = [{"CPU": 2.0}]
ONE_GPU_HOST = [{"CPU": 16.0, "GPU": 1.0}]
# A head with many cores and no GPU, and two small GPU workers: the mixed cluster where a request for
# "the largest node's CPUs" (64) would fit no GPU node.
MIXED = [{"CPU": 64.0}, {"CPU": 8.0, "GPU": 1.0}, {"CPU": 12.0, "GPU": 1.0}]


def test_cpu_only_cluster_splits_the_largest_node():
    assert placement(CPU_BOX) == (2.0, 0.0)
    assert placement(CPU_BOX, 9) == (1.0, 0.0)  # two at a time, the rest queued
    assert placement([{"CPU": 32.0}, {"CPU": 4.0}], 9) == (3.0, 0.0)


def test_one_gpu_host_puts_every_model_task_on_the_gpu():
    assert placement(ONE_GPU_HOST) == (16.0, 1.0)
    # The nine specialists share the GPU at once, with a ninth of its node's cores each.
    assert placement(ONE_GPU_HOST, 9) == (1.0, 0.1111)
    assert placement(ONE_GPU_HOST, 2) == (8.0, 0.5)


def test_cpus_of_a_gpu_task_fit_the_smallest_gpu_node():
    cpus, gpus = placement(MIXED)
    assert gpus == 1.0 and cpus == 8.0  # never 64: no GPU node has that many
    # Two tasks: one GPU each, one per GPU node, each fitting the 8-core one.
    assert placement(MIXED, 2) == (8.0, 1.0)
    # Nine tasks on two GPUs: 0.2222 each, four packed per node, 8 / 4 cores each.
    cpus, gpus = placement(MIXED, 9)
    assert gpus == 0.2222 and cpus == 2.0
    assert 4 * gpus <= 1.0 and 4 * cpus <= 8.0


def test_eight_gpu_node_and_fractional_cpus():
    assert placement([{"CPU": 128.0, "GPU": 8.0}], 9) == (14.0, 0.8888)
    assert placement([{"CPU": 128.0, "GPU": 8.0}], 1) == (128.0, 1.0)
    # Fewer cores than tasks on the node: a fraction of a core each rather than an unplaceable 1.
    cpus, gpus = placement([{"CPU": 2.0, "GPU": 1.0}], 4)
    assert (cpus, gpus) == (0.5, 0.25)


def test_require_gpu_asks_for_one_on_a_cpu_cluster_and_bad_counts_fail():
    assert placement(CPU_BOX, require_gpu=True) == (2.0, 1.0)  # run_all then refuses it by name
    with pytest.raises(ValueError, match="n_tasks"):
        placement(ONE_GPU_HOST, 0)
