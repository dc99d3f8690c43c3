"""Speculative decoding, chosen by the plan's prediction (spec.speculative). Pure.

A CPU decode step streams every weight once whatever its batch, so a step that checks k proposed tokens (and makes
one more) costs little more than a plain one while memory bound, and yields the accepted tokens plus one. It loses
where the step is bound by arithmetic instead: many sequences at once, or weights so small (quantized) that the
extra rows cost more than they save. The performance model (core/performance.py) predicts both steps on the node's
measured rates, so the plan turns speculation on where it is predicted faster for spec.objective, and says why.
docs/speculative.md derives the figures and keeps what was measured.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass

from cpullm import vllm_support
from cpullm.api.spec import Objective, Speculative, SpeculativeMethod
from cpullm.core.performance import (
    DECODE_CONTEXT_TOKENS,
    LAYER_SMALL_KERNELS,
    STEP_PYTHON_MULTIPLE,
    NodePerformance,
    Serving,
    StepBytes,
    decode_step,
    matrix_bytes,
    matrix_rate,
)
from cpullm.core.sizing import ModelSize
from cpullm.core.sizing.anatomy import Split
from cpullm.errors import SpeculationRefused

NGRAM, MTP = SpeculativeMethod.NGRAM.value, SpeculativeMethod.MTP.value
# n-gram's proposals: the tokens that followed the last 2 to 4 tokens where they occurred before in the sequence.
NGRAM_LOOKUP_MIN, NGRAM_LOOKUP_MAX = 2, 4
# What a speculative step's bookkeeping adds (proposing, the rejection sampler, scheduling the drafts), in multiples
# of the probe's fixed piece of engine Python: 1.02 ms a step with n-gram on the tiny model against the probe's 5.25
# ms (bench/spec_bench.py, 2 AMX vCPUs, 2026-11-30; 1.56 ms in a second run: rough). It counts only where a step
# takes milliseconds.
SPECULATION_PYTHON_MULTIPLE = 0.2
# Auto turns speculation on where the objective's figure is predicted at least this much better: the acceptance
# below is a typical rate, not this service's, so a smaller predicted gain could be a loss.
MIN_GAIN = 1.1
# What auto chose for the running servers stays while it is predicted within this band: a method it turned on stays
# on down to MIN_GAIN x KEEP_BAND, and its token count while within KEEP_BAND of the best count. Predictions move
# (a node's probe arriving after its estimate, another vLLM version); a restart of every server to turn speculation
# on and off, or from 3 tokens to 4, for a few percent is not worth it.
KEEP_BAND = 0.95


@dataclass(frozen=True)
class Acceptance:
    """The chance that a proposed token is accepted, given the one before it was; where the figure comes from."""

    rate: float
    source: str
    # The rate of a proposal past the drafter's trained layers (MTP: vLLM runs the checkpoint's last MTP layer again
    # for each further token), None where every proposal is alike.
    reused: float | None = None

    def tokens_per_step(self, proposed: int, trained: int | None = None) -> float:
        """Tokens a checking step yields on average: the accepted run of the proposals, plus the step's own.
        `trained`: how many proposals the drafter has a layer of its own for (the rest at `reused`)."""
        total, run = 1.0, 1.0
        for i in range(proposed):
            run *= self.reused if self.reused is not None and trained is not None and i >= trained else self.rate
            total += run
        return total


ACCEPTANCE = {
    MTP: Acceptance(
        0.85,
        "DeepSeek-V3's report (arXiv 2412.19437, section 5.4.3): its MTP layer's token accepted 85-90% of the time; "
        "0.80 for each token past the checkpoint's MTP layers, which vLLM drafts by running the last one again "
        "(vLLM PR 48892, GSM8K: positions 2-4 accepted 0.79-0.83 of the time the one before was)",
        reused=0.8,
    ),
    # Chat seldom repeats its prompt; summaries, code edits and extraction do, and accept far more.
    NGRAM: Acceptance(0.3, "an assumption for chat-like text (docs/speculative.md has the tests' measured rate)"),
}


@dataclass(frozen=True)
class Speculation:
    """What the plan chose: a method and its tokens, or off (method None), with the predicted gains (against the
    same plan without speculation) and why."""

    method: str | None
    tokens: int
    reason: str
    decode_gain: float | None = None
    throughput_gain: float | None = None
    acceptance: Acceptance | None = None
    mtp_bytes: int = 0  # weights loaded only to speculate (the MTP layers)
    kept_off: bool = False  # auto, for servers planned before the operator chose speculation

    def vllm_config(self) -> str | None:
        """vLLM's --speculative-config value, or None when off."""
        if self.method is None:
            return None
        config: dict[str, object] = {"method": self.method, "num_speculative_tokens": self.tokens}
        if self.method == NGRAM:
            config |= {"prompt_lookup_min": NGRAM_LOOKUP_MIN, "prompt_lookup_max": NGRAM_LOOKUP_MAX}
        return json.dumps(config, separators=(",", ":"))


def off(reason: str) -> Speculation:
    return Speculation(None, 0, reason)


def mtp_problem(model: ModelSize, version: str | None) -> str | None:
    """Why vLLM cannot draft from this checkpoint's MTP layers, or None."""
    if not model.mtp_layers:
        return "the checkpoint has no MTP layers"
    if (
        model.model_type not in vllm_support.MTP_MODEL_TYPES
        and model.architecture not in vllm_support.MTP_ARCHITECTURES
    ):
        return f"vLLM has no MTP drafter for {model.architecture or model.model_type or 'this model'}"
    return _version_problem(MTP, version)


def _version_problem(method: str, version: str | None) -> str | None:
    if version is None:
        return f"the image's vLLM version is unknown, so whether it runs {method} speculation on CPU is too"
    if version not in vllm_support.RELEASES:
        return f"vLLM {version} is not a version the operator knows, so whether it runs {method} speculation is not"
    if method not in vllm_support.speculative_methods(version):
        return f"vLLM {version} does not run {method} speculation on CPU (docs/vllm-versions.md)"
    return None


@dataclass(frozen=True)
class MtpWeights:
    """The MTP layers' weights on a rank: what every token reads, the routed experts', and the embedding and LM
    head's (looked up, and read once a proposed token)."""

    dense: int
    experts: int
    embeddings: int

    @property
    def total(self) -> int:
        return self.dense + self.experts + 2 * self.embeddings


def mtp_weights(model: ModelSize, tp: int) -> MtpWeights:
    """The MTP layers' weights, counted high: each a copy of the largest decoder layer (its attention, a dense MLP
    and a MoE layer's experts where the model has either), a 2h x h projection of the embedding and hidden state,
    and an embedding and LM head of its own (vLLM shares them with the model where the checkpoint does)."""
    anatomy = model.anatomy
    dense = experts = 0
    for linear in anatomy.linears:
        share = matrix_bytes(model, linear) * ((anatomy.experts or 1) if linear.expert else 1)
        share //= 1 if linear.split == Split.REPLICATED else tp
        if linear.expert:
            experts += share
        else:
            dense += share
    hidden = anatomy.embedding_parameters // anatomy.vocabulary if anatomy.vocabulary else 0
    dense += 2 * hidden * hidden * model.dtype_bytes // tp
    layers = model.mtp_layers
    return MtpWeights(layers * dense, layers * experts, anatomy.embedding_parameters * model.dtype_bytes // tp)


def mtp_bytes(model: ModelSize, tp: int) -> int:
    """The MTP layers' weights on a rank, loaded only to speculate (mtp_weights)."""
    return mtp_weights(model, tp).total


@dataclass(frozen=True)
class Gains:
    decode: float
    throughput: float


def gains(
    model: ModelSize,
    serving: Serving,
    node: NodePerformance,
    streams: int,
    kv_bytes_per_token: int,
    method: str,
    tokens: int,
    acceptance: float | None = None,
    context: int = DECODE_CONTEXT_TOKENS,
) -> Gains:
    """The predicted speed with speculation against without: one sequence's and `streams` sequences' generated
    tokens per second, at ACCEPTANCE's rate for the method unless `acceptance` names one (a benchmark's measured
    rate). A checking step runs the proposals and one more token per sequence through the weights; MTP adds a pass
    through its layer and the LM head per proposed token; n-gram's lookup is the engine's Python."""
    chosen = ACCEPTANCE[method] if acceptance is None else Acceptance(acceptance, "")
    yielded = chosen.tokens_per_step(tokens, model.mtp_layers if method == MTP else None)

    def ratio(batch: int) -> float:
        plain = decode_step(model, serving, node, batch, context, kv_bytes_per_token).seconds
        checking = decode_step(model, serving, node, batch, context, kv_bytes_per_token, queries=tokens + 1).seconds
        # Never cheaper than the plain step: a probe's kernel may stream faster at a few rows than at one, which
        # speeds every step alike, not the checking one alone. Then its bookkeeping: with nothing proposed, an n-gram
        # server decoded as fast as a plain one once numba kept off torch's OpenMP threads (api/spec.py
        # SPECULATIVE_ENV; docs/speculative.md).
        checking = max(checking, plain) + SPECULATION_PYTHON_MULTIPLE * node.python_seconds
        return yielded * plain / (checking + _proposing(model, serving, node, batch, method, tokens))

    return Gains(ratio(1), ratio(streams))


def _proposing(
    model: ModelSize, serving: Serving, node: NodePerformance, batch: int, method: str, tokens: int
) -> float:
    """A step's proposals: MTP runs one of its layers (the experts `batch` tokens route to) and the LM head once per
    proposed token, at the step's batch; n-gram's lookup is counted in the engine's Python."""
    if method != MTP:
        return 0.0
    numa, tp = node.slowest(), serving.tensor_parallel_size
    weights, anatomy = mtp_weights(model, tp), model.anatomy
    layers = max(1, model.mtp_layers)
    # One MTP layer read as a decode step reads the model: its dense part, the experts `batch` tokens route to, and
    # the LM head (its embedding is looked up).
    one_layer = StepBytes(
        weights.dense // layers,
        weights.experts // layers,
        anatomy.experts or 0,
        anatomy.active_experts or 0,
        lm_head=weights.embeddings,
    )
    per_token = one_layer.at(batch) / matrix_rate(numa, serving, batch)
    per_token += LAYER_SMALL_KERNELS * numa.small_kernel_seconds(serving.cores_per_rank)
    per_token += STEP_PYTHON_MULTIPLE * node.python_seconds
    return tokens * per_token


def choose(
    wanted: Speculative,
    objective: Objective,
    model: ModelSize,
    serving: Serving,
    node: NodePerformance,
    streams: int,
    kv_bytes_per_token: int,
    version: str | None,
    running: tuple[str, int] | None = None,
) -> Speculation:
    """spec.speculative for this plan: off; a method asked for (SpeculationRefused where vLLM cannot run it here),
    with its predicted gains; or, with auto, the candidate predicted best for the objective where it gains at least
    MIN_GAIN (MTP where the checkpoint carries layers vLLM drafts from; n-gram for the latency objective).
    `running`: the method and token count auto chose for the running servers, kept within KEEP_BAND."""
    if wanted.method == SpeculativeMethod.OFF:
        return off("spec.speculative.method is off")
    server = _Serving(model, serving, node, streams, kv_bytes_per_token)
    if wanted.method != SpeculativeMethod.AUTO:
        method = wanted.method.value
        problem = mtp_problem(model, version) if method == MTP else _version_problem(method, version)
        if problem:
            raise SpeculationRefused(f"spec.speculative.method {method}: {problem}")
        return _best_tokens(method, wanted.tokens, objective, server, "asked for", running)
    candidates = []
    if mtp_problem(model, version) is None:
        candidates.append(MTP)
    if objective == Objective.LATENCY and _version_problem(NGRAM, version) is None:
        candidates.append(NGRAM)
    if not candidates:
        why = mtp_problem(model, version)
        if objective != Objective.LATENCY:
            return off(f"auto, as {why} and n-gram is for the latency objective")
        return off(f"auto, as {why} and {_version_problem(NGRAM, version)}")
    figures = [_best_tokens(method, wanted.tokens, objective, server, "auto", running) for method in candidates]
    best, kept = _best_or_running(figures, objective, lambda s: running is not None and s.method == running[0])
    gain, least = _objective_gain(best, objective), MIN_GAIN * (KEEP_BAND if kept else 1)
    if gain < least:
        return dataclasses.replace(
            off(f"auto: {best.method} predicted {_shown(best, objective)}, under {least:g}x"),
            decode_gain=best.decode_gain,
            throughput_gain=best.throughput_gain,
        )
    return best


def _objective_gain(s: Speculation, objective: Objective) -> float:
    return (s.decode_gain if objective == Objective.LATENCY else s.throughput_gain) or 0.0


def _shown(s: Speculation, objective: Objective) -> str:
    if objective == Objective.LATENCY:
        return f"{s.decode_gain:.2f}x one sequence's decode"
    return f"{s.throughput_gain:.2f}x throughput at maxNumSeqs"


# The token counts a plan tries where the spec names none: each proposed token is accepted less often than the one
# before it, and a checking step costs more rows, so the best count is the prediction's to find.
TOKEN_CHOICES = (1, 2, 3, 4)


@dataclass(frozen=True)
class _Serving:
    """What a prediction of the plan's server takes: the model, how it serves, on what, at what concurrency."""

    model: ModelSize
    serving: Serving
    node: NodePerformance
    streams: int
    kv_bytes_per_token: int


def _best_tokens(
    method: str,
    tokens: int | None,
    objective: Objective,
    server: _Serving,
    how: str,
    running: tuple[str, int] | None = None,
) -> Speculation:
    """The method at spec.speculative.tokens, else at the count of TOKEN_CHOICES predicted best for the objective,
    or at the running servers' count (`running`) while that is within KEEP_BAND of the best."""
    choices = (tokens,) if tokens else TOKEN_CHOICES
    figures = [_predicted(method, k, server, how) for k in choices]
    return _best_or_running(figures, objective, lambda s: running == (method, s.tokens))[0]


def _best_or_running(
    figures: list[Speculation], objective: Objective, is_running: Callable[[Speculation], bool]
) -> tuple[Speculation, bool]:
    """The figure predicted best for the objective, or the running servers' while it is within KEEP_BAND of that;
    and whether the running one was kept."""
    best = max(figures, key=lambda s: _objective_gain(s, objective))
    running = next((s for s in figures if is_running(s)), None)
    if running is not None and _objective_gain(running, objective) >= KEEP_BAND * _objective_gain(best, objective):
        return running, True
    return best, False


def _predicted(method: str, proposed: int, server: _Serving, how: str) -> Speculation:
    model, streams = server.model, server.streams
    found = gains(model, server.serving, server.node, streams, server.kv_bytes_per_token, method, proposed)
    acceptance = ACCEPTANCE[method]
    reason = (
        f"{how}: {method}, {proposed} token{'s' * (proposed != 1)} a step, predicted {found.decode:.2f}x one "
        f"sequence's decode and {found.throughput:.2f}x throughput at {streams} sequences (acceptance "
        f"{acceptance.rate:.2f} a token, {acceptance.source})"
    )
    return Speculation(
        method,
        proposed,
        reason,
        decode_gain=round(found.decode, 2),
        throughput_gain=round(found.throughput, 2),
        acceptance=acceptance,
        mtp_bytes=mtp_bytes(model, 1) if method == MTP else 0,
    )


def with_mtp(model: ModelSize) -> ModelSize:
    """The model as vLLM loads it to speculate with MTP: its MTP layers' weights (mtp_bytes, counted whole) beside
    the model's, and their attention in the KV cache (vLLM's cache space holds the drafter's layers too)."""
    anatomy = model.anatomy
    groups = list(anatomy.kv_groups)
    attention = next((i for i, g in enumerate(groups) if g.state is None and g.window is None), None)
    if attention is not None:
        groups[attention] = dataclasses.replace(groups[attention], layers=groups[attention].layers + model.mtp_layers)
    extra = mtp_bytes(model, 1)
    note = f"{model.mtp_layers} MTP layer(s) loaded to speculate: {extra / 2**30:.2f} GiB more, and their KV cache"
    return dataclasses.replace(
        model,
        weights_bytes=model.weights_bytes + extra,
        anatomy=dataclasses.replace(
            anatomy,
            kv_groups=tuple(groups),
            decoder_layers=anatomy.decoder_layers,
            notes=(*anatomy.notes, note),
        ),
    )
