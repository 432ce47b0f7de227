"""The vLLM engine: in-process `AsyncLLM` (the CPU build here, CUDA on a GPU instance)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats

from gpu_agent import stderr_tail
from gpu_agent.adapters import Adapters, AdaptersBusy, AdapterUnknown
from gpu_agent.bounded_encode import encode_within
from gpu_agent.detokenizer import held_token_ids
from gpu_agent.engine import (
    ACCEPTED,
    EngineBusy,
    EngineConfigError,
    EngineFailed,
    EngineRequestError,
    EngineStep,
    GenerationRequest,
    NoChatTemplate,
    PrefixCacheCounts,
    PromptTooLong,
    ReplyBroken,
)
from gpu_agent.engine_args import chat_template, engine_args
from gpu_agent.grammar import GrammarError, Grammars
from gpu_agent.reasoning import think_tags
from gpu_agent.resumed_prompts import ResumedPrompts, prompt_key
from gpu_agent.token_bytes import TokenBytes
from gpu_agent.tool_calls import ToolCallReader
from gpu_agent.vllm_environment import set_engine_environment
from gpu_agent.vllm_sampling import sampling_params, token_logprobs
from gpu_agent.worker_thread import WorkerThread
from spotgate.context import UNICODE_COMPOSITION_FACTOR
from spotgate.model_store import fetch_model
from spotgate.protocol import ChatMessage, GenerateFrame, Tool
from spotgate.settings import AgentSettings, EngineKind, model_store_aws

ENGINE_DEAD_REASON = "the vLLM engine core died"
STREAM_CONSTRAINTS = "gpu_agent.vllm_logits:StreamConstraints"
BROKEN_SCHEMA_REASON = "the reply ended before it matched the JSON schema"


class PrefixCacheStatLogger(StatLoggerBase):
    """Adds each engine step's prefix-cache queries and hits (in tokens) to `counts`."""

    def __init__(self, counts: PrefixCacheCounts) -> None:
        self._counts = counts

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ) -> None:
        """Count what vLLM's `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits` count.

        Those leave out the lookups of requests resumed after a preemption (`preempted_*`),
        so a prompt is counted once however often the scheduler preempts it.
        """
        if scheduler_stats is None:
            return
        stats = scheduler_stats.prefix_cache_stats
        self._counts.queried_tokens += stats.queries
        self._counts.hit_tokens += stats.hits

    def log_engine_initialized(self) -> None:
        """Nothing to say: the counts are exported by the agent's `/metrics`."""


class VllmEngine:
    """Generation through vLLM's async engine; text is decoded by the agent from token ids."""

    kind: EngineKind = "vllm"

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        model: str,
        capacity: int,
        max_model_len: int,
        tool_call_parser: str | None = None,
        prefix_cache: PrefixCacheCounts | None = None,
        reasoning_parser: str | None = None,
        adapters: Adapters | None = None,
        chat_template: str | None = None,
    ) -> None:
        self._llm = llm
        if chat_template is not None:  # in place of the model's own, as `vllm serve` takes it
            tokenizer.chat_template = chat_template
        # Filled by `llm`'s `PrefixCacheStatLogger`; built without one, it stays at zero.
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCacheCounts()
        self._tokenizer = tokenizer
        # The Rust tokenizer itself: decoding runs on every step of every stream.
        self._backend = tokenizer.backend_tokenizer
        self.model = model
        self.capacity = capacity
        self.max_model_len = max_model_len
        self.max_token_chars = max_token_chars(self._backend)
        self.held_token_ids = held_token_ids(self._backend)
        self._grammars: Grammars | None = None
        # Prompts and schemas each on a thread of their own: a schema that takes long to
        # compile holds back no other request's prompt.
        self._prompt_thread = WorkerThread("prompts")
        self._resumed_prompts = ResumedPrompts()
        self._schema_thread = WorkerThread("schemas")
        self._tool_call_parser = tool_call_parser
        # Found once: an unknown or unusable parser fails the start, not a request.
        self._tool_markers = (
            ToolCallReader(tool_call_parser, tokenizer, ()).markers
            if tool_call_parser is not None
            else []
        )
        self.think_tags = (
            think_tags(reasoning_parser, tokenizer) if reasoning_parser is not None else None
        )
        self._adapters = adapters
        self._adapters_changing = asyncio.Lock()  # one load or unload at a time

    @classmethod
    async def start(cls, settings: AgentSettings) -> VllmEngine:
        """Load the model named in the settings into a new engine (tens of seconds)."""
        from transformers import AutoTokenizer
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        served = settings.served_model_name or settings.model
        engine_settings = settings.vllm
        revision = engine_settings.revision
        args = engine_args(settings)  # before any weight loads: a bad argument stops it here
        chat_template(settings, settings.model, before_load=True)  # so does a bad chat template
        set_engine_environment(
            settings, cpu=current_platform.is_cpu(), kv_cache_bytes=args.kv_cache_memory_bytes
        )
        args.disable_log_stats = True
        args.logits_processors = [STREAM_CONSTRAINTS]
        prefix_cache = PrefixCacheCounts()
        # Prefix caching is left to vLLM: on by default for decoder-only generative models (what
        # an agent serves), off where its models or platforms cannot use it. A stat logger of
        # ours turns vLLM's stats on without its periodic log lines (those stay off with
        # `disable_log_stats`); vLLM then also keeps its own Prometheus counters in the
        # process-wide registry (which the agent does not serve; a later engine in the same
        # process replaces them there rather than clashing).
        tail = stderr_tail.installed()
        if tail is not None:
            tail.mark()
        try:
            llm = AsyncLLM.from_engine_args(
                args,
                stat_loggers=[lambda _config, _index: PrefixCacheStatLogger(prefix_cache)],
            )
        except Exception as err:  # vLLM's says only "see root cause above": its core's stderr
            cause = tail.last_error() if tail is not None else None
            if cause is None:
                raise
            raise EngineConfigError(f"the engine could not start: {cause}") from err
        # Where vLLM found the tokenizer: a staged model's is pulled to local disk.
        tokenizer = AutoTokenizer.from_pretrained(llm.model_config.tokenizer, revision=revision)
        max_model_len = int(llm.model_config.max_model_len)
        return cls(
            llm,
            tokenizer,
            served,
            engine_settings.max_num_seqs,
            max_model_len,
            engine_settings.tool_call_parser,
            prefix_cache,
            engine_settings.reasoning_parser,
            Adapters(
                engine_settings.lora_adapters,
                engine_settings.max_loras,
                functools.partial(
                    fetch_model, cache=Path(settings.model_cache_dir), aws=model_store_aws(settings)
                ),
            )
            if engine_settings.lora_adapters
            else None,
            chat_template(settings, llm.model_config.tokenizer),
        )

    def chat_prompt_text(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[Tool] = (),
        template_kwargs: Mapping[str, object] | None = None,
    ) -> str:
        """The model's own chat template (its `tokenizer_config.json`), assistant turn opened.

        Tools and tool calls go to the template in OpenAI's shapes, as vLLM passes them, and
        `template_kwargs` as its variables (`enable_thinking`, …), as vLLM's do.
        """
        if not self._tokenizer.chat_template:
            raise NoChatTemplate(
                f"model '{self.model}' has no chat template; send a raw prompt "
                "(POST /v1/completions, or 'prompt' in a generate frame)"
            )
        text: str = self._tokenizer.apply_chat_template(
            [message.model_dump(exclude_none=True) for message in messages],
            tools=[tool.model_dump(exclude_none=True) for tool in tools] or None,
            add_generation_prompt=True,
            tokenize=False,
            **(template_kwargs or {}),
        )
        return text

    def chat_prompt_ids(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[Tool] = (),
        template_kwargs: Mapping[str, object] | None = None,
    ) -> list[int]:
        """The chat template's text tokenized, as `apply_chat_template` does (no tokens added)."""
        text = self.chat_prompt_text(messages, tools, template_kwargs)
        return self._encode(text, special_tokens=False)

    def text_prompt_ids(self, prompt: str) -> list[int]:
        """The prompt tokenized as vLLM's completions endpoint does (special tokens added)."""
        return self._encode(prompt, special_tokens=True)

    def _encode(self, text: str, *, special_tokens: bool) -> list[int]:
        # Through `transformers`, which encodes as a batch: the Rust tokenizer then releases
        # the GIL (its single `encode` would hold it), and the event loop goes on meanwhile.
        ids = self._tokenizer.encode(text, add_special_tokens=special_tokens)
        return [int(token) for token in ids]

    async def prompt_ids(self, frame: GenerateFrame, max_prompt_tokens: int) -> list[int]:
        """The request's prompt ids, made on the engine's prompt thread (see `Engine`).

        A resume's are kept (`ResumedPrompts`): the next round of a moving stream finds them.
        """
        key = prompt_key(frame) if frame.resume is not None else None
        ids = self._resumed_prompts.get(key) if key is not None else None
        if ids is None:
            job = functools.partial(self._prompt_ids, frame, max_prompt_tokens)
            ids = await self._prompt_thread.run(job)
            if key is not None:
                self._resumed_prompts.put(key, ids)
        return ids  # too long for this stream's reply: `stream_budget` refuses it, as made ones

    def _prompt_ids(self, frame: GenerateFrame, max_prompt_tokens: int) -> list[int]:
        if frame.messages is None:
            text, special_tokens = frame.prompt or "", True
        else:
            kwargs = frame.chat_template_kwargs()
            text = self.chat_prompt_text(frame.messages, frame.tools or (), kwargs)
            special_tokens = False
        token_chars = max(1, self.max_token_chars)
        if len(text) > max_prompt_tokens * token_chars:  # too long, whatever its tokens
            raise PromptTooLong(-(-len(text) // token_chars))
        encode = functools.partial(self._encode, special_tokens=special_tokens)
        return encode_within(encode, text, max_prompt_tokens)

    def tool_calls(self, tools: Sequence[Tool]) -> ToolCallReader | None:
        """The tool-call parser (vLLM's) named in the settings, for a request offering `tools`."""
        if self._tool_call_parser is None:
            return None
        return ToolCallReader(self._tool_call_parser, self._tokenizer, tools, self._tool_markers)

    def adapter_names(self) -> Collection[str]:
        """The LoRA adapters in the settings."""
        return self._adapters.sources.keys() if self._adapters is not None else ()

    async def _adapter_request(self, name: str, tenant: str | None) -> Any:
        """The adapter's request for vLLM, loaded into the engine first if it is not there.

        Loaded through `add_lora`, which answers a bad adapter with an error and leaves the
        engine serving (a bad adapter met inside a generation would stop the engine core).
        Raises `EngineRequestError` for an adapter that cannot load and `EngineBusy` when
        every slot holds one in use.
        """
        from vllm.lora.request import LoRARequest

        adapters = self._adapters
        if adapters is None:
            raise EngineRequestError(f"model '{self.model}' serves no adapters", param="model")
        async with self._adapters_changing:
            try:
                unload = adapters.to_unload(name, tenant)
            except AdapterUnknown as err:
                raise EngineRequestError(str(err), param="model") from err
            except AdaptersBusy as err:
                raise EngineBusy(str(err)) from err
            if unload is not None:
                await self._llm.remove_lora(adapters.id_of(unload.name))
                adapters.unloaded(unload.name)
            try:
                path = await adapters.path(name)
                request = LoRARequest(name, adapters.id_of(name), str(path))
                if not adapters.is_loaded(name):
                    await self._llm.add_lora(request)
            except Exception as err:  # vLLM wraps a worker's failure in a plain Exception
                raise EngineRequestError(
                    f"adapter '{name}' could not be loaded: {err}", param="model"
                ) from err
            adapters.acquired(name, path, tenant)
        return request

    def prompt_text(self, prompt_ids: Sequence[int]) -> str:
        """The prompt's text as its template wrote it, special tokens kept."""
        text: str = self._backend.decode(list(prompt_ids), skip_special_tokens=False)
        return text

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of the ids, special tokens left out, no clean-up of spaces."""
        text: str = self._backend.decode(list(token_ids), skip_special_tokens=True)
        return text

    def token_bytes(self, token_id: int, *, first: bool) -> bytes:
        """The token's bytes as the tokenizer's decoder writes them (`TokenBytes`)."""
        return self._token_bytes.of(token_id, first=first)

    @functools.cached_property
    def _token_bytes(self) -> TokenBytes:
        return TokenBytes(self._backend.to_str(), self._backend.id_to_token)

    @functools.cached_property
    def _vocab_size(self) -> int:
        # The model's embedding rows: an id past them would fail the engine, not one request.
        return int(self._llm.model_config.get_vocab_size())

    def known_token(self, token_id: int) -> bool:
        """An id within the model's vocabulary."""
        return 0 <= token_id < self._vocab_size

    def running(self) -> int:
        """Unfinished requests in the engine."""
        return int(self._llm.get_num_unfinished_requests())

    def failure(self) -> str | None:
        """Set once the engine core process died or its output loop stopped."""
        return ENGINE_DEAD_REASON if self._llm.errored else None

    async def _schema_matcher(self, request: GenerationRequest) -> Any:
        """The request's grammar, advanced over its resumed tokens (None without a schema).

        Compiled here first, off the event loop: a schema vLLM's engine core would fail on is
        a 400 now, and a resume the schema cannot continue is refused, not generated.
        """
        if request.json_schema is None:
            return None
        try:
            return await self._schema_thread.run(
                functools.partial(self._matcher, request.json_schema, request.resume_ids)
            )
        except GrammarError as err:
            raise EngineRequestError(str(err), param="response_format") from err

    def _matcher(self, schema: str, resume_ids: Sequence[int]) -> Any:
        if self._grammars is None:  # made once, on the schema thread: it reads the whole vocab
            self._grammars = Grammars(self._tokenizer, self._vocab_size)
        return self._grammars.matcher(schema, resume_ids)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineStep, None]:
        """`ACCEPTED` once vLLM has taken the request, then its token ids; leaving early aborts it.

        With a schema, the agent's own matcher follows the tokens too: a reply the engine
        ends before the schema is complete is an error, never malformed JSON as a success.
        """
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        matcher = await self._schema_matcher(request)
        params = sampling_params(request)
        prompt = TokensPrompt(prompt_token_ids=[*request.prompt_ids, *request.resume_ids])
        if request.cache_salt is not None:  # its KV blocks match only prompts of this salt
            prompt["cache_salt"] = request.cache_salt
        adapter = request.adapter
        lora = await self._adapter_request(adapter, request.tenant) if adapter is not None else None
        finished = False
        try:
            # `AsyncLLM.generate`'s two halves: vLLM validates the request as it is added, so
            # a refusal comes before the agent's `start`; then its outputs, as they come.
            outputs = await self._llm.add_request(
                request.request_id, prompt, params, lora_request=lora
            )
            try:
                yield ACCEPTED
                while not finished:
                    output = outputs.get_nowait() or await outputs.get()
                    finished = output.finished
                    completion = output.outputs[0]
                    reason = completion.finish_reason if finished else None
                    ids = list(completion.token_ids)
                    if matcher is not None:
                        for token in ids:
                            matcher.accept_token(token)
                        if reason == "stop" and not matcher.is_terminated():
                            raise ReplyBroken(BROKEN_SCHEMA_REASON)
                    yield EngineStep(
                        ids,
                        "length" if reason == "length" else ("stop" if reason else None),
                        token_logprobs(completion.logprobs, ids, request.logprobs),
                    )
            except EngineDeadError:
                raise  # nothing to abort in an engine that is gone
            except BaseException:  # closed early, cancelled or failed: vLLM must drop it
                if not finished:
                    await self._llm.abort(outputs.request_id, internal=True)
                raise
            finally:
                outputs.close()
        except EngineDeadError as err:
            raise EngineFailed(ENGINE_DEAD_REASON) from err
        except (ValueError, VLLMClientError) as err:
            raise EngineRequestError(str(err), param=getattr(err, "parameter", None)) from err
        finally:
            if adapter is not None and self._adapters is not None:
                self._adapters.released(adapter)

    async def close(self) -> None:
        """Shut the engine's processes and threads down."""
        self._prompt_thread.close()
        self._schema_thread.close()
        self._llm.shutdown()
        # vLLM closes its ZMQ sockets but leaves their context to the garbage collector, which
        # destroys it with a ResourceWarning wherever it happens to run; destroyed here, as
        # the collector would (its sockets are closed, so nothing is cut).
        resources = getattr(getattr(self._llm, "engine_core", None), "resources", None)
        context = getattr(resources, "ctx", None)
        if context is not None:
            context.destroy(linger=0)


def max_token_chars(backend: Any) -> int:
    """An upper bound on the input characters one token of this tokenizer stands for.

    A piece never covers more characters than it has (byte-level pieces have one character
    per byte); a normalizer that composes characters (NFC, NFKC) can fold several into one.
    """
    longest = max(len(piece) for piece in backend.get_vocab(with_added_tokens=True))
    normalizer = backend.normalizer
    state = normalizer.__getstate__() if normalizer is not None else b""
    composes = b'"NFC"' in state or b'"NFKC"' in state
    return longest * UNICODE_COMPOSITION_FACTOR if composes else longest
