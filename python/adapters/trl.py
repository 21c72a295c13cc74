"""TRL's SFTTrainer, unmodified, judged as a gradnorm step (docs/frameworks.md): the adapter
for ``--recipe trl:sft`` and ``--recipe trl:PATH.py:NAME``. SFTTrainer is a Trainer subclass,
so this adapter is Trainer's (python/adapters/transformers.py) with SFTTrainer's own dataset
preparation, collator and SFTConfig.
"""

import dataclasses

import torch

import gradnorm_frameworks as _gf
import gradnorm_transformers as _gtr

IGNORE_INDEX = _gf.IGNORE_INDEX


# SFTConfig fields the scenario decides beside Trainer's: each rank's samples are laid out
# in the dataset where a sequential sampler and accelerate's sharding give them to it
# (_SFTRun._dataset).
_OWNED_TRL = {
    "train_sampling_strategy": "(sequential: each rank's own micro-batches, in order)",
    "dataset_kwargs": "(the dataset is pre-tokenized and prepared by SFTTrainer itself)",
    "model_init_kwargs": "(the model is the scenario's)",
}


class _SFTRun(_gtr._TrainerRun):
    """TRL's SFTTrainer (a Trainer subclass) on this rank. SFTTrainer takes a datasets.Dataset
    only (sft_trainer.py's __init__ refuses anything else) and prepares it itself, so the
    rank's samples cannot be served in the order asked: every sample of every step is laid
    out where a sequential sampler and accelerate's sharding (global micro-batch g goes to
    rank g mod W) hand it to this rank, other ranks' places holding a placeholder sequence
    (token 0 throughout, every label valid) this rank never trains on. The collator is
    SFTTrainer's own (DataCollatorForLanguageModeling), recording what it collated; the
    tokenizer (a processing class SFTTrainer requires, to find its pad token) is a word-level
    one over the scenario's vocabulary, built here: the dataset is already tokenized."""

    def _fixed(self):
        # transformers 5.x's TrainingArguments field; 4.57.6 has none and always samples at
        # random (4.57.6 trainer.py:1053-1080): _constructed then serves in order.
        if self._sequential_field():
            return {"train_sampling_strategy": "sequential"}
        return {}

    def _sequential_field(self):
        return "train_sampling_strategy" in {f.name for f in
                                             dataclasses.fields(self.recipe.config_class)}

    def _dataset(self):
        import datasets
        datasets.disable_progress_bars()  # its map/filter progress would interleave
        s = self.scenario
        length, batch = int(s["sequence_length"]), self.micro_batch_size
        per_rank = self.steps * self.accumulation_steps
        placeholder = [0] * length
        input_ids, labels = [], []
        self._own = []  # this rank's places in the dataset, in the order it trains on them
        for g in range(per_rank * self.dp_size):
            k, owner = divmod(g, self.dp_size)
            if owner != self.dp_rank:
                input_ids += [placeholder] * batch
                labels += [placeholder] * batch
                continue
            self._own += range(len(input_ids), len(input_ids) + batch)
            micro = self.ctx.batches_of(k // self.accumulation_steps)[k % self.accumulation_steps]
            for row in range(batch):
                tokens, aligned = _gf.aligned_sample(micro, row)
                input_ids.append(tokens.tolist())
                labels.append(aligned.tolist())
        return datasets.Dataset.from_dict({"input_ids": input_ids, "labels": labels})

    def _tokenizer(self):
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel
        from transformers import PreTrainedTokenizerFast
        vocab = {"t%d" % i: i for i in range(int(self.scenario["vocab_size"]))}
        return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")),
                                       pad_token="t0", eos_token="t0", unk_token="t0")

    def _trainer_kwargs(self):
        self._given = self._dataset()
        return dict(train_dataset=self._given, processing_class=self._tokenizer())

    def _constructed(self, trainer):
        given, kept = len(self._given), len(trainer.train_dataset)
        lost = torch.tensor([int(kept != given)])
        if self.dp_size > 1:  # every rank stops, or the others would wait in DDP's all-reduce
            torch.distributed.all_reduce(lost, op=torch.distributed.ReduceOp.MAX)
        if kept == given and int(lost):
            raise RuntimeError("rank %d: another rank's SFTTrainer dataset preparation dropped "
                               "sequences (that rank says which)" % self.dp_rank)
        if kept != given:
            dropped = [i for i, labels in enumerate(self._given["labels"])
                       if all(label == IGNORE_INDEX for label in labels)]
            raise RuntimeError(
                "rank %d: SFTTrainer's dataset preparation kept %d of the %d sequences given "
                "(%d of them have no valid label; with max_length set it drops such sequences, "
                "so the micro-batches regroup and the scenario's cannot be trained as given; "
                "--recipe-arg max_length=None keeps them)" % (self.dp_rank, kept, given,
                                                              len(dropped)))
        own = trainer.data_collator
        trainer.data_collator = lambda features: self.collate(features, own)
        if not self._sequential_field():
            # No sequential sampler to ask for: the dataset SFTTrainer prepared is served to
            # its sampler in this rank's order, whatever index it asks for, as _Dataset does
            # for Trainer. SFTTrainer's preparation has run; the feeding proof still checks
            # every step.
            trainer.train_dataset = _InOrder(trainer.train_dataset, self._own, self.dp_rank)


class _InOrder(torch.utils.data.Dataset):
    """A prepared dataset served in a fixed order of its rows, whatever index is asked for;
    as long as the whole dataset, so that a sampler and accelerate's sharding give each rank
    as many samples as they would."""

    def __init__(self, prepared, order, rank):
        self._prepared, self._order, self._rank, self._next = prepared, order, rank, 0

    def __len__(self):
        return len(self._prepared)

    def __getitem__(self, index):
        if self._next >= len(self._order):
            raise RuntimeError("SFTTrainer asked rank %d for more samples than the scenario's "
                               "steps hold" % self._rank)
        row = self._prepared[self._order[self._next]]
        self._next += 1
        return row


def load_sft(target, args, module_name, framework="trl"):
    """(file, step function, cannot_run, objective, what runs) for --recipe trl:TARGET."""
    try:
        import transformers
        transformers.Trainer  # noqa: B018 (imported lazily: Trainer's own imports run here)
        import trl
        trl.SFTTrainer  # noqa: B018 (the same)
    except (ImportError, RuntimeError) as error:
        raise _gf.import_error(
            framework, target, error,
            "scripts/install-deps.sh installs TRL in .venv/trl-1.16.0 (requirements-trl.txt; "
            "beside transformers 4.57.6, .venv/trl-1.16.0-transformers-4.57.6 before "
            ".venv/transformers-4.57.6): put it first on PYTHONPATH") from None
    flavour = _gtr.Flavour("trl", trl.SFTTrainer, "sft", trl.SFTConfig,
                           dict(_gtr._OWNED, **_OWNED_TRL), _gf.release("trl"), _SFTRun)
    return _gtr.load_flavour(target, args, module_name, flavour,
                             "%s's SFTTrainer%s (%s%s)"
                             % (_gf.release("trl"), _gf.origin("trl"), _gf.release("transformers"),
                                _gf.origin("transformers")))


_gf.register("trl", load_sft)
