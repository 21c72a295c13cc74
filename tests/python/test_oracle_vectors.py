"""Oracle vectors from `gradnorm export`, read the way a user's pytest suite reads them:
the shipped helper (python/gradnorm_torch.py) reproduces gradnorm's model and loss, passes
the shipped transcriptions of torchtune's step and the pull request's skip where gradnorm
does, and fails a broken step and the skip on ragged ranks, naming what disagrees.

Run by ctest (tests/python/oracle_vectors.sh) with GRADNORM_VECTORS set to the export folder.
"""

import glob
import os

import pytest
import torch

import gradnorm_torch
import full_finetune
import skip

VECTORS = os.environ["GRADNORM_VECTORS"]
STEPS = os.path.join(os.path.dirname(__file__), "steps")


def vectors(name):
    return gradnorm_torch.load_vectors(os.path.join(VECTORS, name + ".pt"))


def all_files():
    return sorted(glob.glob(os.path.join(VECTORS, "**", "*.pt"), recursive=True))


def test_every_export_loads_with_torch_load():
    files = all_files()
    assert len(files) >= 10
    from torch.jit._pickle import restore_type_tag
    for path in files:
        # torch >= 2.6 loads weights-only by default: the files need nothing beyond LibTorch's
        # type tag for typed lists and dicts.
        with torch.serialization.safe_globals([restore_type_tag]):
            data = torch.load(path, weights_only=True)
        assert data["format"] == "gradnorm oracle vectors"
        v = gradnorm_torch.load_vectors(path)
        world = v.scenario["world_size"]
        assert len(v.batches) == v.scenario["steps"]
        assert all(len(ranks) == world for ranks in v.batches)
        for name in v.trainable:
            assert v.oracle["steps"] == [] or v.oracle["steps"][0]["gradients"][name].dtype == torch.float64


@pytest.mark.parametrize("path", all_files())
def test_the_helpers_model_and_loss_are_gradnorms(path):
    gradnorm_torch.load_vectors(path).check_model()


@pytest.mark.parametrize("name", ["single/n5/float32", "single/n5/bfloat16", "single/accum2-chunked/float32",
                                  "single/n5-linear-ce/float32", "single/clip-active/float32",
                                  "single/n5-momentum-3steps/float32", "dist/5-3/float32",
                                  "dist/5-3/bfloat16", "dist/accum2-ragged/float32",
                                  "dist/5-3-clip-active/float32", "dist/8-ranks-ragged/float32"])
def test_the_baseline_transcription_agrees(name):
    vectors(name).assert_agrees(full_finetune.step)


def test_skip_agrees_on_one_device():
    vectors("single/n5/float32").assert_agrees(skip.step)


def test_skip_is_caught_on_ragged_ranks():
    v = vectors("dist/5-3/float32")
    with pytest.raises(gradnorm_torch.Disagreement, match="gradient rel L2 error"):
        v.assert_agrees(skip.step)


def test_a_broken_step_is_caught_with_the_check_that_failed():
    import importlib.util
    spec = importlib.util.spec_from_file_location("local_mean", os.path.join(STEPS, "local_mean.py"))
    local_mean = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(local_mean)
    problems = vectors("dist/5-3/float32").compare(vectors("dist/5-3/float32").run(local_mean.step))
    assert any("gradient rel L2 error" in p for p in problems), problems
    assert any("logged loss" in p for p in problems), problems


def test_a_tighter_stated_tolerance_is_honoured():
    # bfloat16 agrees under gradnorm's bfloat16 tolerance, not under float64's.
    v = vectors("single/n5/bfloat16")
    v.assert_agrees(full_finetune.step)
    with pytest.raises(gradnorm_torch.Disagreement):
        v.assert_agrees(full_finetune.step, tensor_rel_l2=1e-12, scalar_rel=1e-12)


def test_the_documented_finding_on_an_empty_rank_reproduces():
    # Rank 0 has no valid token but N > 0: the gradients are right, but the recipe's mean
    # loss on the empty micro-batch is NaN, and so is the logged loss (gradnorm's finding).
    v = vectors("dist/0-8/float32")
    problems = v.compare(v.run(full_finetune.step))
    assert problems and all("logged loss nan" in p for p in problems), problems


def test_no_valid_token_demands_an_error_or_a_non_finite_result():
    empty = vectors("single/all-masked-mean_ce/float32")
    assert empty.oracle["no_gradient"]
    empty.assert_agrees(full_finetune.step)  # NaN: the documented N == 0 behaviour

    def silent(ctx):  # guards the division: zero gradients and a finite loss
        for batch in ctx.micro_batches:
            (ctx.model(batch["tokens"]).sum() * 0).backward()
        ctx.optimizer.step()
        return {"loss_to_log": 0.0}

    with pytest.raises(gradnorm_torch.Disagreement, match="silent update"):
        empty.assert_agrees(silent)


def test_a_file_that_is_not_an_export_is_refused(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"weights": torch.ones(2)}, path)
    with pytest.raises(ValueError, match="not a gradnorm oracle vectors file"):
        gradnorm_torch.load_vectors(path)


def test_a_step_that_quietly_does_nothing_at_n0_is_caught():
    empty = vectors("single/all-masked-mean_ce/float32")

    def nothing(ctx):
        return {"loss_to_log": 0.0}

    with pytest.raises(gradnorm_torch.Disagreement, match="neither raised nor returned a non-finite"):
        empty.assert_agrees(nothing)


def test_clipping_that_never_ran_is_caught():
    v = vectors("single/clip-active/float32")

    def no_clip(ctx):
        num_tokens, running_loss = full_finetune.backward_token_sums(ctx)
        full_finetune.scale_grads_(ctx.model.parameters(), 1.0 / num_tokens)
        ctx.optimizer.step()
        return {"loss_to_log": (running_loss / num_tokens).item()}

    with pytest.raises(gradnorm_torch.Disagreement, match="clip_grad_norm_ never ran"):
        v.assert_agrees(no_clip)


def test_a_step_writing_into_its_batch_leaves_the_vectors_alone():
    v = vectors("single/n5/float32")
    labels_before = [b["labels"].clone() for b in v.batches[0][0]]

    def vandal(ctx):
        for batch in ctx.micro_batches:
            batch["labels"].fill_(-100)
        return None

    v.run(vandal)
    for before, batch in zip(labels_before, v.batches[0][0]):
        assert torch.equal(before, batch["labels"])
    v.assert_agrees(full_finetune.step)
