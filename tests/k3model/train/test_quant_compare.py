"""QAT vs PTQ (k3model/train/quant_compare.py): the recovered fraction by hand, the KL to the
reference; the three arms run end to end in tests/assets/test_deploy.py."""

import copy
import math

import pyarrow as pa
import pytest
import torch

from datagen.io import with_metadata
from datagen.sft import FORMAT
from k3model.quantize import convert_to_mx
from k3model.train.quant_compare import compare_qat_ptq, own_token_kl, recovered
from k3model.train.sft import Demonstrations, SFTConfig

from tests.k3model.test_model import smoke_model


def test_recovered_is_torchaos_fraction():
    # bf16 2.0, PTQ 2.4, QAT 2.1: QAT closes 0.3 of PTQ's 0.4 gap (losses: the sign cancels).
    assert math.isclose(recovered(2.1, 2.4, 2.0), 0.75)
    assert math.isclose(recovered(0.6, 0.5, 0.7), 0.5)  # on a success rate
    assert recovered(2.5, 2.4, 2.0) < 0
    assert math.isnan(recovered(2.1, 2.0, 2.0))


def _demos(vocab=512, rows=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(4, vocab, (12,), generator=g).tolist() for _ in range(rows)]
    table = pa.table({"input_ids": ids, "loss_mask": [[0] * 4 + [1] * 8] * rows, "effort": ["low"] * rows,
                      "domain": ["general_tasks"] * rows, "harness": ["hermes"] * rows})
    return with_metadata(table, {"format": FORMAT})


@torch.no_grad()
def test_kl_to_the_reference_is_zero_for_itself_and_positive_after_ptq():
    reference = smoke_model(1)
    demos = Demonstrations(_demos(), 512)
    assert own_token_kl(reference, copy.deepcopy(reference), demos) == pytest.approx(0.0, abs=1e-9)
    assert own_token_kl(reference, convert_to_mx(copy.deepcopy(reference)), demos) > 1e-6


def test_compare_refuses_a_short_fraction_that_leaves_no_bf16_steps(tmp_path):
    with pytest.raises(ValueError, match="short_frac"):
        compare_qat_ptq(SFTConfig(profile="smoke", steps=4), _demos(), _demos(seed=1), tmp_path, short_frac=1.0)
    with pytest.raises(ValueError, match="no high-precision steps"):
        compare_qat_ptq(SFTConfig(profile="smoke", steps=1), _demos(), _demos(seed=1), tmp_path, short_frac=0.5)
