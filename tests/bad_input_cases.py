"""The bad-input cases of `tests/test_bad_input.py`, across every command, and the workspace of
broken files they point at. `benchmarks/reliability_table.py` runs that test and writes the
table in `reports/reliability.md` from what it recorded.

Each case is the argument list of one `advisor` invocation, with ``{placeholders}`` filled
from :func:`build_workspace`, the exit code it must end with, and two fragments its one
`Error:` line must hold: one naming the problem, one naming the fix.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TINY_MODEL = SHARED / "models" / "tinystories-656k"
EVAL_DATA = SHARED / "data" / "eval"
LOCAL_TASKS_DIR = Path(__file__).resolve().parents[1] / "advisor" / "accuracy" / "tasks"


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    exit_code: int
    problem: str  # the Error line names the problem with this
    fix: str  # ... and the fix with this
    needs: tuple[str, ...] = ()  # workspace keys that may be missing here (the case is skipped then)
    cpu_only: bool = False  # on a machine with a GPU the command would run for real
    missing_modules: tuple[str, ...] = ()  # made unimportable for the case (a driver that is not installed)
    never_shown: tuple[str, ...] = ()  # text that must not appear anywhere (a password)
    fault: str | None = None  # a fault of the machine the test brings about (FAULTS in test_bad_input.py)
    added: str = ""  # the issue whose review found the case (reports/reliability.md shows it)


def case(id: str, args: str | list[str], exit_code: int, problem: str, fix: str, **kw) -> Case:
    return Case(id, tuple(args.split() if isinstance(args, str) else args), exit_code, problem, fix, **kw)


SEARCH = "search -r {tiny_recipe} --out {fresh_out}"

CASES: list[Case] = [
    # ---------------------------------------------------------------- search: output and storage
    case("search --out is a file", "search -r {tiny_recipe} --out {a_file}", 2,
         "is a file, not a folder", "give a path whose parents are folders"),
    case("search --out under a file", "search -r {tiny_recipe} --out {a_file}/sub", 2,
         "is a file, not a folder", "give a path whose parents are folders"),
    case("search --out read-only", "search -r {tiny_recipe} --out {read_only}", 2,
         "cannot create", "give a folder you can write to", needs=("read_only",)),
    case("search --storage unparsable", f"{SEARCH} --storage notaurl", 2,
         "cannot parse 'notaurl' as a database URL", "give one like sqlite:///"),
    case("search --storage unknown database", f"{SEARCH} --storage foo://host/db", 2,
         "not a database SQLAlchemy knows", "give a URL like sqlite:///"),
    case("search --storage asyncio driver", f"{SEARCH} --storage postgresql+asyncpg://u@localhost/db", 2,
         "is an asyncio driver", "name a synchronous one"),
    case("search --storage postgresql:// without psycopg", f"{SEARCH} --storage postgresql://u:s3cret@localhost/db",
         3, "needs the database driver module 'psycopg'", "pip install 'psycopg[binary]'",
         missing_modules=("psycopg", "psycopg2", "pg8000"), never_shown=("s3cret",)),
    case("search --storage postgresql+psycopg2 without it", f"{SEARCH} --storage postgresql+psycopg2://u@localhost/db",
         3, "needs the database driver module 'psycopg2'", "pip install 'psycopg2-binary'",
         missing_modules=("psycopg", "psycopg2", "pg8000")),
    case("search --storage mysql:// without mysqlclient", f"{SEARCH} --storage mysql://u@localhost/db", 3,
         "needs the database driver module 'MySQLdb'", "pip install 'mysqlclient'",
         missing_modules=("MySQLdb", "pymysql")),
    case("search --storage sqlite in a missing folder", f"{SEARCH} --storage sqlite:///{{ws}}/no/such/dir/s.db", 2,
         "SQLite does not create folders", "create it or give another path"),
    case("search --storage sqlite file that is no database", f"{SEARCH} --storage sqlite:///{{a_file}}", 2,
         "is not an SQLite database", "move it away"),
    case("search --storage in-memory sqlite", f"{SEARCH} --storage sqlite://", 2,
         "in-memory SQLite database", "give a file: sqlite:///"),
    case("search on an existing study without --resume", "search -r {tiny_recipe} --out {run_out}", 2,
         "already exists", "pass --resume"),
    # ---------------------------------------------------------------- search: the model
    case("search --model folder missing", f"{SEARCH} --model {{ws}}/no_model", 2,
         "does not exist", "give a model folder"),
    case("search --model a plain file", f"{SEARCH} --model {{a_file}}", 2,
         "is a file", "give a directory, a hub id or a .gguf file"),
    case("search --model folder without config.json", f"{SEARCH} --model {{empty_dir}}", 2,
         "has no config.json", "give the folder that holds config.json"),
    case("search --model corrupt config.json", f"{SEARCH} --model {{corrupt_config}}", 2,
         "cannot read the model config", "give a folder with a valid config.json"),
    case("search --model unknown model_type", f"{SEARCH} --model {{unknown_type}}", 2,
         "is not supported", "supported model types: gemma2"),
    case("search --model BERT encoder", f"{SEARCH} --model {{bert}}", 2,
         "not a causal (decoder-only) language model", "causal LMs such as Llama"),
    case("search --model T5 encoder-decoder", f"{SEARCH} --model {{t5}}", 2,
         "not a causal (decoder-only) language model", "causal LMs such as Llama"),
    case("search --model config without weights", f"{SEARCH} --model {{no_weights}}", 2,
         "has a config.json but no weights", "give the complete model folder"),
    case("search --gguf-file not in the model folder", f"{SEARCH} --gguf-file none.gguf", 2,
         "none.gguf is not a file in", "name a .gguf file that is there"),
    case("search --model GGUF missing", f"{SEARCH} --model {{ws}}/none.gguf", 2,
         "does not exist", "give the path of a .gguf file"),
    case("search --model GGUF header only", f"{SEARCH} --model {{gguf_header_only}}", 2,
         "is truncated: its 2 tensors need", "download it again"),
    case("search --model GGUF cut inside the header", f"{SEARCH} --model {{gguf_cut}}", 2,
         "truncated GGUF file", "download it again"),
    case("search --model .gguf that is no GGUF", f"{SEARCH} --model {{gguf_garbage}}", 2,
         "no GGUF magic bytes", "download it again"),
    case("search --model GGUF of an encoder (t5)", f"{SEARCH} --model {{gguf_t5}}", 2,
         "an encoder, not a causal", "causal LMs such as Llama"),
    case("search --model GGUF architecture transformers lacks", f"{SEARCH} --model {{gguf_rwkv}}", 2,
         "which transformers cannot load from GGUF", "convert it to a Hugging Face folder"),
    case("search 1M+1M-token workload on a 512-position model",
         f"{SEARCH} --input-tokens 1000000 --output-tokens 1000000", 2,
         "input_tokens + output_tokens 2000000: longer than the model's context of 512", "shorten to at most 512"),
    case("search calibration seq_len 4096 on a 512-position model", "search -r {long_calibration_recipe}", 2,
         "calibration.seq_len 4096", "shorten to at most 512"),
    # ---------------------------------------------------------------- search: tasks and files
    case("search --tasks unknown name", f"{SEARCH} --tasks nonexistent_task_xyz", 2,
         "unknown task 'nonexistent_task_xyz'", "check the spelling"),
    case("search --tasks a group", f"{SEARCH} --tasks mmlu", 2,
         "is a group of lm-eval tasks", "name its tasks one by one"),
    case("search --tasks task YAML missing", f"{SEARCH} --tasks {{ws}}/missing_task.yaml", 2,
         "does not exist", "give the path of a task YAML"),
    case("search --tasks task YAML not YAML", f"{SEARCH} --tasks {{task_broken_yaml}}", 2,
         "is not valid YAML", "fix that line"),
    case("search --tasks task YAML without task key", f"{SEARCH} --tasks {{task_no_key}}", 2,
         "must be a mapping with a 'task' key", "task"),
    case("search --tasks task YAML bad output_type", f"{SEARCH} --tasks {{task_bad_type}}", 2,
         "invalid output_type 'bogus'", "fix the task YAML"),
    case("search --tasks task YAML unknown field", f"{SEARCH} --tasks {{task_unknown_field}}", 2,
         "unexpected keyword argument 'foo_unknown'", "fix the task YAML"),
    case("search --tasks task YAML template error", f"{SEARCH} --tasks {{task_bad_template}}", 2,
         "'nonexistent_field' is undefined", "fix the task YAML"),
    case("search --tasks task YAML whose metric is not per item", f"{SEARCH} --tasks {{task_no_acc}}", 2,
         "not a mean of per-item values", "put a per-item metric"),
    case("search --tasks local task, data file missing", "search -r {missing_data_recipe}", 2,
         "piqa.jsonl does not exist", "give the folder holding piqa.jsonl"),
    case("search --calibration file missing", f"{SEARCH} --calibration {{ws}}/none.txt", 2,
         "does not exist", "give a .txt or .jsonl file"),
    case("search --calibration JSONL line not JSON", f"{SEARCH} --calibration {{calib_not_json}}", 2,
         "line 2 is not JSON", "give one JSON object per line"),
    case("search --calibration JSONL not UTF-8", f"{SEARCH} --calibration {{calib_not_utf8}}", 2,
         "is not UTF-8 text", "give a UTF-8 .jsonl file"),
    case("search --calibration JSONL without text", f"{SEARCH} --calibration {{calib_no_text}}", 2,
         "holds no text", 'give rows like {"text": "..."}'),
    case("search --calibration unknown named set", f"{SEARCH} --calibration set:nosuch", 2,
         "unknown calibration set 'nosuch'", "or give set:PATH.yaml"),
    case("search --calibration set spec without text_field", f"{SEARCH} --calibration set:{{set_no_field}}", 2,
         "text_field: field required", "give a YAML spec like calibration/cnn_dailymail.yaml"),
    case("search --calibration hub set, hub offline", f"{SEARCH} --calibration set:{{set_hub}}", 3,
         "cannot read dataset 'advisor-tests/no-such-set'", "or give a local .txt/.jsonl file", fault="hub offline"),
    case("search --energy-profile missing", f"{SEARCH} --energy-profile {{ws}}/none.json", 2,
         "cannot read profile", "give a profile JSON written by `advisor profile`"),
    case("search --energy measured without a GPU", f"{SEARCH} --energy measured", 3,
         "energy: measured", "use --energy predicted", cpu_only=True),
    case("search --device cuda without a GPU", f"{SEARCH} --device cuda", 3,
         "torch sees no CUDA GPU", "use --device cpu", cpu_only=True),
    # ---------------------------------------------------------------- search: recipe and flags
    case("search -r missing recipe", "search -r {ws}/none.yaml", 2,
         "cannot read recipe", "give the path of a YAML recipe"),
    case("search -r recipe not YAML", "search -r {recipe_broken_yaml}", 2,
         "is not valid YAML", "fix that line"),
    case("search -r recipe is a list", "search -r {recipe_list}", 2,
         "must be a YAML mapping of fields, got a list", "write `field: value` lines"),
    case("search -r recipe with an unknown field", "search -r {recipe_unknown_field}", 2,
         "nmae: unknown field", "docs/recipe.md lists every field"),
    case("search --target unknown", f"{SEARCH} --target x100", 2,
         "target (set by a flag): got 'x100'", "'h100', 'h200' or 'b200'"),
    case("search NVFP4 on an H100", f"{SEARCH} --target h100 --formats bf16,nvfp4", 2,
         "do not run natively on target h100", "drop them or choose target b200"),
    case("search --formats without bf16", f"{SEARCH} --formats fp8", 2,
         "formats", "must include bf16"),
    case("search --formats unknown", f"{SEARCH} --formats bf16,int3", 2,
         "got 'int3'", "'bf16', 'fp8' or 'nvfp4'"),
    case("search --trials 0", f"{SEARCH} --trials 0", 2,
         "search.trials (set by a flag): got 0", "greater than or equal to 1"),
    case("search --max-kl negative", f"{SEARCH} --max-kl -1", 2,
         "accuracy.max_kl (set by a flag): got -1", "greater than 0"),
    case("search --sampler unknown", f"{SEARCH} --sampler foo", 2,
         "search.sampler (set by a flag): got 'foo'", "'guided'"),
    case("search --name with a slash", f"{SEARCH} --name a/b", 2,
         "name (set by a flag): got 'a/b'", "should match pattern"),
    case("search --batch-size 0", f"{SEARCH} --batch-size 0", 2,
         "batch_size (set by a flag): got 0", "greater than or equal to 1"),
    case("search --trials not a number", f"{SEARCH} --trials abc", 2,
         "Invalid value for '--trials'", "see `advisor search --help`"),
    case("search unknown option", f"{SEARCH} --bogus", 2,
         "No such option: --bogus", "see `advisor search --help`"),
    # ---------------------------------------------------------------- report
    case("report on a folder that is no run", "report {empty_dir}", 2,
         "is not a run directory", "give the folder `advisor search` wrote"),
    case("report on a missing folder", "report {ws}/no_run", 2,
         "is not a run directory", "give the folder `advisor search` wrote"),
    case("report on a corrupt study.db", "report {corrupt_run}", 2,
         "is not an SQLite database", "move it away"),
    case("report on a study whose search failed early", "report {early_run}", 2,
         "holds no run record", "rerun `advisor search`"),
    case("report with a broken recipe.json", "report {broken_meta_run}", 2,
         "is not the run file `advisor search` writes", "rerun the search"),
    case("report with a number for recipe.json's storage_url", "report {number_url_run}", 2,
         "is not the run file `advisor search` writes", "rerun the search", added="audit 2026-12-01"),
    case("report whose study.db is gone", "report {gone_db_run}", 2,
         "does not exist", "pass --storage"),
    case("report naming a study the storage lacks", "report {wrong_name_run}", 2,
         "no study named 'other'", "pass --storage"),
    case("report --storage unparsable", "report {run} --storage notaurl", 2,
         "cannot parse 'notaurl'", "give one like sqlite:///"),
    # ---------------------------------------------------------------- show
    case("show without summary.json", "show {empty_dir}", 2,
         "is not a run directory", "give the folder `advisor search` wrote"),
    case("show summary.json not JSON", "show {summary_not_json}", 2,
         "is not valid JSON", "rebuild it with `advisor report"),
    case("show summary.json a list", "show {summary_list}", 2,
         "is not a precision-advisor summary.json", "rebuild it with `advisor report"),
    case("show summary.json of the wrong shape", "show {summary_wrong_shape}", 2,
         "is not a valid summary.json: trials", "rebuild it with `advisor report"),
    case("show summary.json of schema version 1", "show {summary_v1}", 2,
         "summary schema version 1", "rebuild it with `advisor report"),
    case("show --plan unknown", "show {run} --plan nope", 2,
         "no plan 'nope'", "known:"),
    # ---------------------------------------------------------------- eval
    case("eval --plan neither file nor format", "eval --plan fp4 --model {tiny_model} --tasks lambada_openai "
         "--data-dir {eval_data}", 2, "neither a plan file nor a uniform format", "bf16, fp8, nvfp4"),
    case("eval --plan file that is no plan", "eval --plan {a_file} --model {tiny_model} --tasks lambada_openai "
         "--data-dir {eval_data}", 2, "not a plan", "writes one"),
    case("eval --tasks empty", "eval --plan bf16 --tasks ,", 2,
         "--tasks", "give at least one task"),
    case("eval --tasks unknown", "eval --plan bf16 --model {tiny_model} --tasks nonexistent_task_xyz", 2,
         "unknown task", "check the spelling"),
    case("eval --limit 0", "eval --plan bf16 --limit 0", 2, "--limit", "must be at least 1"),
    case("eval --batch-size 0", "eval --plan bf16 --batch-size 0", 2, "--batch-size", "must be at least 1"),
    case("eval --data-dir missing", "eval --plan bf16 --data-dir {ws}/no_data", 2,
         "is not a directory", "give the folder holding the tasks' JSONL files"),
    case("eval --device unknown", "eval --plan bf16 --device tpu", 2, "--device: got 'tpu'", "allowed: auto, cpu"),
    case("eval --cache-dir is a file", "eval --plan bf16 --model {tiny_model} --tasks piqa --data-dir {eval_data} "
         "--cache-dir {a_file}", 2, "is a file, not a folder", "give a folder path"),
    case("search recipe not UTF-8", "search -r {recipe_not_utf8}", 2, "is not UTF-8 text",
         "give a YAML recipe saved as UTF-8"),
    case("worker on a missing SQLite study", "worker --study tiny --storage sqlite:///{ws}/no_study.db", 2,
         "does not exist", "pass --storage with the study's URL"),
    case("worker on a missing journal", "worker --study tiny --storage journal:{ws}/no_study.journal", 2,
         "does not exist", "pass --storage with the study's URL"),
    case("worker --work-dir is a file", "worker --study tiny --storage sqlite:///{run}/study.db --work-dir {a_file}",
         2, "--work-dir", "give a folder path"),
    case("eval local task, data file missing", "eval --plan bf16 --model {tiny_model} --tasks piqa "
         "--data-dir {empty_dir}", 2, "piqa.jsonl does not exist", "give the folder holding piqa.jsonl"),
    case("eval --out under a file", "eval --plan bf16 --model {tiny_model} --tasks lambada_openai "
         "--data-dir {eval_data} --out {a_file}/scores.json", 2, "is a file, not a folder",
         "give a path whose parents are folders"),
    case("eval --model BERT encoder", "eval --plan bf16 --model {bert} --tasks lambada_openai "
         "--data-dir {eval_data}", 2, "not a causal (decoder-only) language model", "causal LMs such as Llama"),
    case("eval --device cuda without a GPU", "eval --plan bf16 --model {tiny_model} --tasks lambada_openai "
         "--data-dir {eval_data} --device cuda", 3, "no CUDA GPU", "use --device cpu", cpu_only=True),
    # ---------------------------------------------------------------- export
    case("export RUN_DIR missing", "export {ws}/no_run --out {ws}/export", 2,
         "is not a directory", "give the folder `advisor search` wrote"),
    case("export RUN_DIR without summary.json", "export {empty_dir} --out {ws}/export", 2,
         "does not exist", "give the run folder or the summary.json `advisor search` wrote"),
    case("export --out is a file", "export {run} --out {a_file}", 2,
         "is a file, not a folder", "give a folder path"),
    case("export --out not empty", "export {run} --out {run}", 2,
         "exists and is not empty", "give a new folder"),
    case("export --out read-only", "export {run} --out {read_only}/export", 2,
         "cannot create", "give a folder you can write to", needs=("read_only",)),
    case("export --plan unknown", "export {run} --out {ws}/export --plan nope", 2,
         "no plan 'nope'", "known:"),
    case("export --model BERT encoder", "export {run} --out {ws}/export --model {bert}", 2,
         "not a causal (decoder-only) language model", "causal LMs such as Llama"),
    case("export without --out", "export {run}", 2, "Missing option '--out'", "see `advisor export --help`"),
    # ---------------------------------------------------------------- recheck (every error exits 2)
    case("recheck summary missing", "recheck --recommendation {ws}/none.json --model {tiny_model}", 2,
         "does not exist", "give the run folder or the summary.json `advisor search` wrote"),
    case("recheck summary not JSON", "recheck --recommendation {summary_not_json} --model {tiny_model}", 2,
         "is not valid JSON", "rebuild it with `advisor report"),
    case("recheck summary without recommendation", "recheck --recommendation {summary_no_rec} "
         "--model {tiny_model}", 2, "holds no recommendation", "finish the search first"),
    case("recheck --model folder missing", "recheck --recommendation {run} --model {ws}/no_model "
         "--out {ws}/recheck", 2, "does not exist", "give a model folder"),
    case("recheck --model BERT encoder", "recheck --recommendation {run} --model {bert} --out {ws}/recheck", 2,
         "not a causal (decoder-only) language model", "causal LMs such as Llama"),
    case("recheck --out is a file", "recheck --recommendation {run} --model {tiny_model} --out {a_file}", 2,
         "is a file, not a folder", "give a folder path"),
    case("recheck --device unknown", "recheck --recommendation {run} --model {tiny_model} --device tpu", 2,
         "--device: got 'tpu'", "allowed: auto, cpu, cuda"),
    case("recheck --research-trials 0", "recheck --recommendation {run} --model {tiny_model} "
         "--research-trials 0", 2, "Invalid value for '--research-trials'", "see `advisor recheck --help`"),
    case("recheck --engine unknown", "recheck --recommendation {run} --model {tiny_model} --engine sglang", 2,
         "--engine: got 'sglang'", "allowed: builtin", added="issue 38"),
    case("recheck --engine without a GPU", "recheck --recommendation {run} --model {tiny_model} --engine builtin",
         3, "NVML sees none", "leave --engine out", cpu_only=True, added="issue 38"),
    # ---------------------------------------------------------------- profile and measure
    case("measure --ttft-ms below --tpot-ms", "measure --plan {tiny_plan} --tpot-ms 10 --ttft-ms 5", 2,
         "ttft_ms 5 is below tpot_ms 10", "raise ttft_ms", added="issue 39"),
    case("profile without a GPU", "profile --out {ws}/profile.json", 3,
         "no NVIDIA GPU visible", "measures the GPU it runs on", cpu_only=True),
    case("profile --out under a file", "profile --out {a_file}/p.json", 2,
         "is a file, not a folder", "give a path whose parents are folders"),
    case("measure without a GPU", "measure --plan {tiny_plan} --model {tiny_model}", 3,
         "no NVIDIA GPU visible", "measures on the GPU it runs on", cpu_only=True),
    case("measure --plan missing", "measure --plan {ws}/none.json", 2,
         "cannot read plan file", "writes one"),
    case("measure --plan not a plan", "measure --plan {a_file}", 2, "not a plan", "writes one"),
    case("measure --plan for another model", "measure --plan {tiny_plan}", 2,
         "does not match the model's layer groups", "give the model it was searched on"),
    case("measure --batch 0", "measure --plan {tiny_plan} --batch 0", 2, "--batch", "must be >= 1"),
    case("measure --target unknown", "measure --plan {tiny_plan} --target x100", 2,
         "--target must be one of h100, h200, b200", "h100"),
    case("measure --model BERT encoder", "measure --plan {tiny_plan} --model {bert}", 2,
         "not a causal (decoder-only) language model", "causal LMs such as Llama"),
    # ---------------------------------------------------------------- issue 36: inputs that crashed or hung
    case("search --max-kl inf", f"{SEARCH} --max-kl inf", 2,
         "accuracy.max_kl (set by a flag): got inf", "Input should be a finite number", added="issue 36"),
    case("search --max-kl nan", f"{SEARCH} --max-kl nan", 2,
         "accuracy.max_kl (set by a flag): got nan", "Input should be a finite number", added="issue 36"),
    case("search --seed -1", f"{SEARCH} --seed -1", 2,
         "search.seed (set by a flag): got -1", "give a whole number from 0 to 4294967295", added="issue 36"),
    case("search --seed 1e20", f"{SEARCH} --seed 1e20", 2,
         "Invalid value for '--seed'", "see `advisor search --help`", added="issue 36"),
    case("search recipe seed 1.0e+20", "search -r {recipe_huge_seed}", 2,
         "search.seed: got 1e+20", "give a whole number from 0 to 4294967295", added="issue 36"),
    case("eval --seed -1", "eval --plan bf16 --seed -1", 2, "--seed: got -1",
         "give a whole number from 0 to 4294967295", added="issue 36"),
    case("search --model 0-byte model.safetensors", f"{SEARCH} --model {{weights_empty}}", 2,
         "model.safetensors is 0 bytes", "download or copy the model again", added="issue 36"),
    case("search --model model.safetensors cut in its header", f"{SEARCH} --model {{weights_cut_header}}", 2,
         "is not a complete safetensors file", "download or copy the model again", added="issue 36"),
    case("search --model model.safetensors cut in its tensors", f"{SEARCH} --model {{weights_cut}}", 2,
         "is truncated: its tensors need", "download or copy the model again", added="issue 36"),
    case("search --storage journal: without a path", f"{SEARCH} --storage journal:", 2,
         "journal: names no file", "give one like journal:runs/study.journal", added="issue 36"),
    case("search --storage journal file that is no journal", f"{SEARCH} --storage journal:{{a_file}}", 2,
         "is not an Optuna journal file", "move it away", added="issue 36"),
    case("search --storage journal: a folder", f"{SEARCH} --storage journal:{{empty_dir}}", 2,
         "is a folder", "give the journal file inside it", added="issue 36"),
    case("search --storage journal: a FIFO", f"{SEARCH} --storage journal:{{fifo}}", 2,
         "is a FIFO (named pipe), not a regular file", "give the path of an Optuna journal file", added="issue 36"),
    case("search --tasks binary task YAML", f"{SEARCH} --tasks {{task_binary}}", 2,
         "is not UTF-8 text", "give a task YAML saved as UTF-8", added="issue 36"),
    case("search --tasks Latin-1 task YAML", f"{SEARCH} --tasks {{task_latin1}}", 2,
         "is not UTF-8 text", "give a task YAML saved as UTF-8", added="issue 36"),
    case("search --tasks a FIFO", f"{SEARCH} --tasks {{fifo_task}}", 2,
         "is a FIFO (named pipe), not a regular file", "give the path of a task YAML", added="issue 36"),
    case("search -r a FIFO", "search -r {fifo}", 2,
         "is a FIFO (named pipe), not a regular file", "give the path of a YAML recipe file", added="issue 36"),
    case("measure --plan a FIFO", "measure --plan {fifo}", 2,
         "is a FIFO (named pipe), not a regular file", "writes one", added="issue 36"),
    case("search --energy-profile a FIFO", f"{SEARCH} --energy-profile {{fifo}}", 2,
         "is a FIFO (named pipe), not a regular file", "give a profile JSON written by `advisor profile`",
         added="issue 36"),
    case("search --calibration a FIFO", f"{SEARCH} --calibration {{fifo_calibration}}", 2,
         "is a FIFO (named pipe), not a regular file", "give a .txt or .jsonl file", added="issue 36"),
    case("search -r a folder", "search -r {empty_dir}", 2,
         "is a folder, not a regular file", "give the path of a YAML recipe file", added="issue 36"),
    case("search --out a dangling symlink", "search -r {tiny_recipe} --out {dangling_link}", 2,
         "which does not exist", "remove the link or give another folder", added="issue 36"),
    case("search --out a looping symlink", "search -r {tiny_recipe} --out {looping_link}", 2,
         "loops back on itself", "remove the link or give another folder", added="issue 36"),
    case("export --out a dangling symlink", "export {run} --out {dangling_link}", 2,
         "which does not exist", "remove the link or give another folder", added="issue 36"),
    case("search --storage password with a raw @", f"{SEARCH} --storage postgresql://user:se@cret123@127.0.0.1:9/db",
         2, "holds a raw '@'", "percent-encode it ('@' as %40", never_shown=("cret123", "se@"), added="issue 36"),
    case("report --storage password with a raw @", "report {run} --storage postgresql://user:se@cret123@127.0.0.1:9/db",
         2, "holds a raw '@'", "percent-encode it ('@' as %40", never_shown=("cret123", "se@"), added="issue 36"),
    case("recheck --model another model", "recheck --recommendation {run} --model {other_model} --out {ws}/recheck",
         2, "is not a new version of this run's model", "run `advisor search` on", added="issue 36"),
    case("report on a full disk", "report {run_copy}", 3, "no space left on the disk",
         "free space there or write to another disk", fault="disk full", added="issue 36"),
    # ---------------------------------------------------------------- the command line itself
    case("option without its value", "show {run} --plan", 2, "Option '--plan' requires an argument",
         "see `advisor show --help`"),
    case("unknown command", "serve", 2, "No such command 'serve'", "see `advisor --help`"),
    case("unknown global option", "--verbose show {empty_dir}", 2, "No such option: --verbose",
         "see `advisor --help`"),
    # issue 54: summary and exit codes
    case("show summary.json whose KL is NaN", "show {summary_kl_nan}", 2,
         ".kl: got nan; a KL is a finite number >= 0", "rebuild it with `advisor report", added="issue 54"),
    case("show summary.json whose KL is -1", "show {summary_kl_negative}", 2,
         ".kl: got -1.0; a KL is a finite number >= 0", "rebuild it with `advisor report", added="issue 54"),
    case("show summary.json whose J/token is infinite", "show {summary_j_inf}", 2,
         ".energy.0.j_per_token: got inf; a J/token is a finite number > 0", "rebuild it with `advisor report",
         added="issue 54"),
    case("show summary.json without the recommended trial", "show {summary_rec_gone}", 2,
         "is not among the trials", "rebuild it with `advisor report", added="issue 54"),
    case("export summary.json without the recommended trial", "export {summary_rec_gone_dir} --out {ws}/export54",
         2, "is not among the trials", "rebuild it with `advisor report", added="issue 54"),
    case("recheck summary.json without the recommended trial", "recheck --recommendation {summary_rec_gone} "
         "--model {tiny_model} --out {ws}/recheck54", 2, "is not among the trials", "rebuild it with `advisor report",
         added="issue 54"),
    case("verify summary.json without the recommended trial", "verify {summary_rec_gone_dir}", 2,
         "is not among the trials", "rebuild it with `advisor report", added="issue 54"),
    case("export summary.json whose KL is NaN", "export {summary_kl_nan_dir} --out {ws}/export54", 2,
         ".kl: got nan", "rebuild it with `advisor report", added="issue 54"),
    case("recheck summary.json whose KL is -1", "recheck --recommendation {summary_kl_negative} --model {tiny_model} "
         "--out {ws}/recheck54", 2, ".kl: got -1.0", "rebuild it with `advisor report", added="issue 54"),
    case("measure --plan a binary file", "measure --plan {binary_file}", 2,
         "is not UTF-8 text", "writes one", added="issue 54"),
    case("search --storage journal: in a read-only folder", f"{SEARCH} --storage journal:{{read_only}}/s.journal", 2,
         "cannot open the journal", "give a journal file in a folder you can write to", needs=("read_only",),
         added="issue 54"),
    case("search --storage sqlite:/// in a read-only folder", f"{SEARCH} --storage sqlite:///{{read_only}}/s.db", 2,
         "cannot open sqlite:///", "give a storage you can write to", needs=("read_only",), added="issue 54"),
    case("search --name of 300 characters", f"{SEARCH} --name {'a' * 300}", 2,
         "name (set by a flag)", "String should have at most 255 characters", added="issue 54"),
    case("search --out with a 300-character name", f"search -r {{tiny_recipe}} --out {{ws}}/{'b' * 300}", 2,
         "a file name in it is too long for the file system", "give a shorter path or name", added="issue 54"),
    case("verify --plan unknown, without vLLM", "verify {run} --plan nope", 2,
         "no plan 'nope'", "known:", added="issue 54"),
    case("verify --lambada missing, without vLLM", "verify {run} --lambada {ws}/none.jsonl", 2,
         "--lambada: cannot read", "give a LAMBADA JSONL file", added="issue 54"),
    case("verify --lambada a binary file, without vLLM", "verify {run} --lambada {binary_file}", 2,
         "is not UTF-8 text", "give a LAMBADA JSONL file", added="issue 54"),
    case("search --workload with a key twice", f"{SEARCH} --workload chat:batch=16,batch=32", 2,
         "batch sets batch_size a second time", "give each setting once", added="issue 54"),
    case("search --gpu-memory within the 2 GiB reserve", f"{SEARCH} --gpu-memory 1.5", 2,
         "every GPU keeps 2 GiB free", "give more than 2 GiB", added="issue 54"),
    case("search --storage ''", [*SEARCH.split(), "--storage", ""], 2,
         "storage (set by a flag): got ''; an empty URL names no database", "give one like sqlite:///",
         added="issue 54"),
    case("show on a missing folder", "show {ws}/no_run", 2,
         "does not exist", "give the folder `advisor search` wrote", added="issue 54"),
    # issue 54: model config vs weights
    case("search --model config of 4 layers over 2-layer weights", f"{SEARCH} --model {{cfg_4_layers}}", 2,
         "says num_hidden_layers 4, but the weights hold 2 layers; model.layers.2.self_attn.q_proj.weight is missing",
         "give the config.json that came with these weights", added="issue 54"),
    case("search --model config of 1 layer over 2-layer weights", f"{SEARCH} --model {{cfg_1_layer}}", 2,
         "says num_hidden_layers 1, but the weights hold 2 layers; model.layers.1.",
         "give the config.json that came with these weights", added="issue 54"),
    case("search --model Qwen2 config over Llama weights", f"{SEARCH} --model {{cfg_qwen2}}", 2,
         "model.layers.0.self_attn.q_proj.bias is missing from the weights",
         "give the config.json that came with these weights", added="issue 54"),
    case("search --model Llama config with attention_bias over weights without", f"{SEARCH} --model {{cfg_bias}}", 2,
         "model.layers.0.self_attn.q_proj.bias is missing from the weights, but the config's model has it "
         "(attention_bias true)", "give the config.json that came with these weights", added="issue 54"),
    case("search --model hidden_size 64 over 128-wide weights", f"{SEARCH} --model {{cfg_hidden}}", 2,
         "lm_head.weight is [2048, 128] in the weights, but config.json makes it [2048, 64]",
         "give the config.json that came with these weights", added="issue 54"),
    case("search --model vocab_size 4096 over a 2048-token table", f"{SEARCH} --model {{cfg_vocab}}", 2,
         "lm_head.weight is [2048, 128] in the weights, but config.json makes it [4096, 128]",
         "give the config.json that came with these weights", added="issue 54"),
    case("search --dry-run config of 4 layers over 2-layer weights",
         "search -r {tiny_recipe} --dry-run --gpus 1 --gpu-memory 80 --model {cfg_4_layers}", 2,
         "says num_hidden_layers 4, but the weights hold 2 layers", "give the config.json that came with these weights",
         added="issue 54"),
    case("eval --model config of 4 layers over 2-layer weights", "eval --plan bf16 --model {cfg_4_layers} "
         "--tasks lambada_openai --data-dir {eval_data}", 2, "says num_hidden_layers 4, but the weights hold 2 layers",
         "give the config.json that came with these weights", added="issue 54"),
    case("export --model hidden_size 64 over 128-wide weights", "export {run} --out {ws}/export54 --model {cfg_hidden}",
         2, "lm_head.weight is [2048, 128] in the weights", "give the config.json that came with these weights",
         added="issue 54"),
    case("recheck --model vocab_size 4096 over a 2048-token table", "recheck --recommendation {run} "
         "--model {cfg_vocab} --out {ws}/recheck54", 2, "config.json makes it [4096, 128]",
         "give the config.json that came with these weights", added="issue 54"),
    case("search --model config without hidden_size", f"{SEARCH} --model {{cfg_no_hidden}}", 2,
         "config.json has no hidden_size", "give the config.json that came with the model's weights", added="issue 54"),
    case("search --dry-run config without hidden_size",
         "search -r {tiny_recipe} --dry-run --gpus 1 --gpu-memory 80 --model {cfg_no_hidden}", 2,
         "config.json has no hidden_size", "give the config.json that came with the model's weights", added="issue 54"),
    case("search --model config of 0 layers", f"{SEARCH} --model {{cfg_0_layers}}", 2,
         "num_hidden_layers is 0, not a positive whole number", "give the config.json that came with the model's",
         added="issue 54"),
    case("search --model config of -2 layers", f"{SEARCH} --model {{cfg_minus_2_layers}}", 2,
         "num_hidden_layers is -2, not a positive whole number", "give the config.json that came with the model's",
         added="issue 54"),
    case('search --model config hidden_size "128"', f"{SEARCH} --model {{cfg_hidden_str}}", 2,
         'hidden_size is "128", not a positive whole number', "give the config.json that came with the model's",
         added="issue 54"),
    case("search --model GGUF block_count 2 over 1 block", f"{SEARCH} --model {{gguf_missing_block}}", 2,
         "llama.block_count says 2 layers, but blk.1.* tensors are missing", "convert or download the model again",
         added="issue 54"),
    case("search --dry-run --gpus 100000", "search -r {tiny_recipe} --dry-run --gpus 100000 --gpu-memory 80", 2,
         "--gpus 100000: a plan is for one node of 1 to 64 GPUs", "give at most 64", added="issue 54"),
    case("search --model GPT-2 (no adapter)", f"{SEARCH} --model {{gpt2}}", 2,
         "model_type 'gpt2' is not supported", "supported model types:", added="issue 54"),
    case("search --dry-run --model GPT-2 (no adapter)",
         "search -r {tiny_recipe} --dry-run --gpus 1 --gpu-memory 80 --model {gpt2}", 2,
         "model_type 'gpt2' is not supported", "supported model types:", added="issue 54"),
    case("search --model Mamba (no adapter)", f"{SEARCH} --model {{mamba}}", 2,
         "model_type 'mamba' is not supported", "supported model types:", added="issue 54"),
    case("search --dry-run --model BERT encoder", "search -r {tiny_recipe} --dry-run --gpus 1 --gpu-memory 80 "
         "--model {bert}", 2, "not a causal (decoder-only) language model", "causal LMs such as Llama",
         added="issue 54"),
    case("search --dry-run --model T5 encoder-decoder", "search -r {tiny_recipe} --dry-run --gpus 1 --gpu-memory 80 "
         "--model {t5}", 2, "not a causal (decoder-only) language model", "causal LMs such as Llama",
         added="issue 54"),
    case("search --dry-run --device tpu", "search -r {tiny_recipe} --dry-run --gpus 1 --gpu-memory 80 --device tpu",
         2, "device (set by a flag): got 'tpu'", "Input should be 'auto', 'cpu' or 'cuda'", added="audit 2026-12-01"),
    case("search --dry-run --calibration missing", "search -r {tiny_recipe} --dry-run --gpus 1 --gpu-memory 80 "
         "--calibration {ws}/missing.txt", 2, "missing.txt does not exist", "give a .txt or .jsonl file",
         added="audit 2026-12-01"),
    case("search --dry-run --storage foo://bar", "search -r {tiny_recipe} --dry-run --gpus 1 --gpu-memory 80 "
         "--storage foo://bar", 2, "is not a database SQLAlchemy knows", "give a URL like", added="audit 2026-12-01"),
    case("search --dry-run --tasks nosuchtask", "search -r {tiny_recipe} --dry-run --gpus 1 --gpu-memory 80 "
         "--tasks nosuchtask", 2, "unknown task 'nosuchtask'", "check the spelling", added="audit 2026-12-01"),
    case("search --model demo:foo", f"{SEARCH} --model demo:foo", 2, "'demo:foo' is no demo model here",
         "the demo is demo:smollm2-135m", added="audit 2026-12-01"),
    case("verify --engine foo", "verify {run} --engine foo", 2, "--engine: got 'foo'",
         "`advisor verify` serves through --engine vllm only", added="audit 2026-12-01"),
    case("measure --engine vllm --checkpoint missing", "measure --plan {tiny_plan} --engine vllm "
         "--checkpoint {ws}/nockpt", 2, "nockpt is not a folder", "give the folder `advisor export` wrote",
         added="audit 2026-12-01"),
    case("measure --model missing folder", "measure --plan {tiny_plan} --model {ws}/nomodel", 2,
         "nomodel does not exist", "give a model folder (with config.json)", added="audit 2026-12-01"),
    case("profile --target a100 (before the GPU)", "profile --target a100", 2,
         "--target must be one of h100, h200, b200, got 'a100'", "h100, h200, b200", added="audit 2026-12-01"),
    case("eval --model GPT-2 (no adapter)", "eval --plan bf16 --model {gpt2} --tasks lambada_openai "
         "--data-dir {eval_data}", 2, "model_type 'gpt2' is not supported", "supported model types:",
         added="issue 54"),
    case("recheck --model GPT-2 (no adapter)", "recheck --recommendation {run} --model {gpt2} --out {ws}/recheck54",
         2, "model_type 'gpt2' is not supported", "supported model types:", added="issue 54"),
]


# ---------------------------------------------------------------- the workspace the cases point at


def tiny_recipe(out: Path, **changes) -> dict:
    recipe = {
        "name": "tiny", "model": {"source": str(TINY_MODEL)}, "target": "h100", "formats": ["bf16", "fp8"],
        "workloads": [{"name": "chat", "batch_size": 8, "input_tokens": 128, "output_tokens": 64}],
        "calibration": {"num_samples": 2, "seq_len": 16, "heldout_samples": 2, "heldout_seq_len": 16},
        "search": {"trials": 2, "seed": 0, "sampler": "random"}, "out": str(out), "device": "cpu",
    }
    for key, value in changes.items():
        recipe[key] = value
    return recipe


def _write(path: Path, text: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def _yaml(path: Path, data) -> str:
    return _write(path, yaml.safe_dump(data))


def _model_dir(path: Path, config: dict, weights: bool = True) -> str:
    _write(path / "config.json", json.dumps(config))
    if weights:  # the checks never read weights; their presence is enough
        _write(path / "model.safetensors", b"")
    return str(path)


def _gguf(path: Path, arch: str) -> str:
    import numpy as np
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), arch=arch)
    writer.add_context_length(512)
    writer.add_token_list(["a", "b", "c"])
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.add_tensor("output.weight", np.zeros((4, 8), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def _writable(folder: Path) -> bool:
    try:
        fd, name = tempfile.mkstemp(dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def read_only_folder(ws: Path) -> str | None:
    """A folder nobody can write into: a chmod-555 one, or (as root, whom modes do not stop) /sys."""
    folder = ws / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    if not _writable(folder):
        return str(folder)
    for candidate in (Path("/sys"), Path("/proc")):
        if candidate.is_dir() and not _writable(candidate):
            return str(candidate)
    return None


def _task(ws: Path, name: str, change) -> str:
    cfg = yaml.safe_load((LOCAL_TASKS_DIR / "lambada_openai.yaml").read_text())
    cfg["dataset_kwargs"]["data_files"]["test"] = str(EVAL_DATA / "lambada_openai.jsonl")
    change(cfg)
    return _yaml(ws / "tasks" / f"{name}.yaml", cfg)


def _summary_variants(ws: Path, run: Path) -> dict[str, str]:
    summary = json.loads((run / "summary.json").read_text())
    wrong = {**summary, "trials": "x"}
    v1 = {k: v for k, v in summary.items() if k != "schema_version"}
    no_rec = {**summary, "recommendation": None}
    return {
        "summary_not_json": _write(ws / "s_not_json" / "summary.json", "{broken"),
        "summary_list": _write(ws / "s_list" / "summary.json", "[1, 2]"),
        "summary_wrong_shape": _write(ws / "s_wrong" / "summary.json", json.dumps(wrong)),
        "summary_v1": _write(ws / "s_v1" / "summary.json", json.dumps(v1)),
        "summary_no_rec": _write(ws / "s_no_rec" / "summary.json", json.dumps(no_rec)),
    }


def _issue36_files(ws: Path, run: Path) -> dict[str, str]:
    """Cut weights, another model, FIFOs, broken links, undecodable task files, a copy of the run."""
    import shutil

    from transformers import LlamaConfig

    from advisor.testing import random_model

    weights = (TINY_MODEL / "model.safetensors").read_bytes()
    folders = {}
    for key, data in (("weights_empty", b""), ("weights_cut_header", weights[:1000]), ("weights_cut", weights[:-100])):
        folder = ws / key
        folder.mkdir()
        for f in TINY_MODEL.iterdir():
            if f.name != "model.safetensors":
                shutil.copy(f, folder / f.name)
        (folder / "model.safetensors").write_bytes(data)
        folders[key] = str(folder)
    other = ws / "other_model"  # another width, depth and vocabulary (weights that agree with them, never read)
    other.mkdir()
    for f in TINY_MODEL.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, other / f.name)
    config = json.loads((TINY_MODEL / "config.json").read_text())
    config.update(vocab_size=4096, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    random_model(LlamaConfig(**config)).save_pretrained(other)
    for name in ("fifo", "fifo_task.yaml", "fifo_calibration.jsonl"):
        os.mkfifo(ws / name)
    (ws / "dangling_link").symlink_to(ws / "nowhere")
    (ws / "looping_link").symlink_to(ws / "looping_link")
    run_copy = ws / "run_copy"
    shutil.copytree(run, run_copy)
    return {
        **folders,
        "other_model": str(other),
        "fifo": str(ws / "fifo"),
        "fifo_task": str(ws / "fifo_task.yaml"),
        "fifo_calibration": str(ws / "fifo_calibration.jsonl"),
        "dangling_link": str(ws / "dangling_link"),
        "looping_link": str(ws / "looping_link"),
        "task_binary": _write(ws / "tasks" / "binary.yaml", bytes(range(256))),
        "task_latin1": _write(ws / "tasks" / "latin1.yaml", "task: caf\u00e9\n".encode("latin-1")),
        "recipe_huge_seed": _write(ws / "huge_seed.yaml", yaml.safe_dump(tiny_recipe(ws / "runs")).replace(
            "seed: 0", "seed: 1.0e+20")),
        "run_copy": str(run_copy),
    }


def _issue54_files(ws: Path, run: Path) -> dict[str, str]:
    """Hand-edited summaries (each in a folder of its own, for the commands that take the run folder) and a binary
    file."""
    summary = json.loads((run / "summary.json").read_text())
    rec = summary["recommendation"]
    at = next(i for i, t in enumerate(summary["trials"]) if t["trial"] == rec["trial"])

    def edited(name: str, change) -> str:
        data = json.loads(json.dumps(summary))
        change(data)
        return _write(ws / name / "summary.json", json.dumps(data))

    def kl(value):  # the recommendation and its trial alike, as a careful hand would
        return lambda d: [r.update(kl=value) for r in (d["recommendation"], d["trials"][at])]

    def j_inf(d):
        for r in (d["recommendation"], d["trials"][at]):
            r["energy"][0]["j_per_token"] = "Infinity"

    files = {
        "summary_kl_nan": edited("s54_kl_nan", kl("NaN")),  # how the writer spells a float that is not finite
        "summary_kl_negative": edited("s54_kl_negative", kl(-1)),
        "summary_j_inf": edited("s54_j_inf", j_inf),
        "summary_rec_gone": edited("s54_rec_gone", lambda d: d["trials"].pop(at)),
        "binary_file": _write(ws / "binary.json", bytes(range(256))),
    }
    return {**files, "summary_kl_nan_dir": str(ws / "s54_kl_nan"), "summary_rec_gone_dir": str(ws / "s54_rec_gone")}


def _runs_with_broken_storage(ws: Path, run: Path) -> dict[str, str]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    meta = json.loads((run / "recipe.json").read_text())
    corrupt = ws / "corrupt_run"
    _write(corrupt / "study.db", bytes(range(256)) * 8)
    _write(corrupt / "recipe.json", json.dumps({**meta, "storage_url": f"sqlite:///{corrupt / 'study.db'}"}))
    early = ws / "early_run"  # what a search leaves when it stops before the model is prepared
    early.mkdir()
    optuna.create_study(study_name="tiny", storage=f"sqlite:///{early / 'study.db'}", directions=["minimize"] * 2)
    _write(early / "recipe.json", json.dumps({**meta, "storage_url": f"sqlite:///{early / 'study.db'}"}))
    return {
        "corrupt_run": str(corrupt),
        "early_run": str(early),
        "broken_meta_run": str(Path(_write(ws / "broken_meta_run" / "recipe.json", "{not json")).parent),
        "number_url_run": str(Path(_write(ws / "number_url_run" / "recipe.json", json.dumps(
            {**meta, "storage_url": 12}))).parent),
        "gone_db_run": str(Path(_write(ws / "gone_db_run" / "recipe.json", json.dumps(
            {**meta, "storage_url": f"sqlite:///{ws / 'gone' / 'study.db'}"}))).parent),
        "wrong_name_run": str(Path(_write(ws / "wrong_name_run" / "recipe.json", json.dumps(
            {**meta, "name": "other", "storage_url": f"sqlite:///{(run / 'study.db').resolve()}"}))).parent),
    }


def _issue54_model_files(ws: Path) -> dict[str, str]:
    """The trained tiny Llama's weights under configs that do not describe them, configs without or with broken
    size fields, families without an adapter, and a GGUF file whose metadata names a layer it lacks."""
    import numpy as np
    from gguf import GGUFWriter

    llama = json.loads((TINY_MODEL / "config.json").read_text())
    qwen2 = {**llama, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
    configs = {
        "cfg_4_layers": {**llama, "num_hidden_layers": 4}, "cfg_1_layer": {**llama, "num_hidden_layers": 1},
        "cfg_qwen2": qwen2, "cfg_bias": {**llama, "attention_bias": True}, "cfg_hidden": {**llama, "hidden_size": 64},
        "cfg_vocab": {**llama, "vocab_size": 4096},
        "cfg_no_hidden": {k: v for k, v in llama.items() if k != "hidden_size"},
        "cfg_0_layers": {**llama, "num_hidden_layers": 0}, "cfg_minus_2_layers": {**llama, "num_hidden_layers": -2},
        "cfg_hidden_str": {**llama, "hidden_size": "128"},
    }
    out = {}
    for key, config in configs.items():
        folder = ws / "issue54" / key
        folder.mkdir(parents=True)
        for f in TINY_MODEL.iterdir():
            if f.name != "config.json":
                (folder / f.name).symlink_to(f)  # the very weights and tokenizer of the tiny model
        (folder / "config.json").write_text(json.dumps(config))
        out[key] = str(folder)
    gguf = ws / "issue54" / "missing_block.gguf"
    writer = GGUFWriter(str(gguf), arch="llama")
    writer.add_block_count(2)
    writer.add_token_list(["a", "b", "c", "d"])
    for name in ("token_embd.weight", "blk.0.attn_q.weight"):
        writer.add_tensor(name, np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gpt2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 1, "n_embd": 32, "n_head": 2,
            "vocab_size": 64}
    mamba = {"model_type": "mamba", "architectures": ["MambaForCausalLM"], "hidden_size": 32, "num_hidden_layers": 1,
             "vocab_size": 64}
    return {**out, "gguf_missing_block": str(gguf), "gpt2": _model_dir(ws / "issue54" / "gpt2", gpt2),
            "mamba": _model_dir(ws / "issue54" / "mamba", mamba)}


def build_workspace(ws: Path, run: Path) -> dict[str, str]:
    """Every file and folder the cases name, under ``ws``; ``run`` is a finished tiny search."""
    llama = json.loads((TINY_MODEL / "config.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    gguf_full = Path(_gguf(ws / "gguf" / "full.gguf", "llama"))
    data = gguf_full.read_bytes()
    out = {
        "ws": str(ws),
        "run": str(run),
        "run_out": str(run.parent),
        "fresh_out": str(ws / "runs"),
        "tiny_model": str(TINY_MODEL),
        "eval_data": str(EVAL_DATA),
        "a_file": _write(ws / "a_file", "not a folder\n"),
        "empty_dir": str(Path(_write(ws / "empty" / ".keep", "")).parent),
        "tiny_recipe": _yaml(ws / "tiny.yaml", tiny_recipe(ws / "runs")),
        "long_calibration_recipe": _yaml(ws / "long_cal.yaml", tiny_recipe(ws / "runs", calibration={
            "num_samples": 2, "seq_len": 4096, "heldout_samples": 2, "heldout_seq_len": 16})),
        "missing_data_recipe": _yaml(ws / "missing_data.yaml", tiny_recipe(ws / "runs", benchmark={
            "tasks": ["piqa"], "data_dir": str(ws / "empty")})),
        "recipe_broken_yaml": _write(ws / "broken.yaml", "name: [tiny\n"),
        "recipe_list": _write(ws / "list.yaml", "- name: tiny\n"),
        "recipe_not_utf8": _write(ws / "latin1.yaml", "name: caf\u00e9\n".encode("latin-1")),
        "recipe_unknown_field": _yaml(ws / "unknown_field.yaml", {**tiny_recipe(ws / "runs"), "nmae": "x"}),
        "set_no_field": _yaml(ws / "sets" / "no_field.yaml", {"why": "x", "dataset": "json"}),
        "set_hub": _yaml(ws / "sets" / "hub.yaml", {"why": "x", "dataset": "advisor-tests/no-such-set",
                                                   "text_field": "text"}),
        "bert": _model_dir(ws / "bert", {"model_type": "bert", "architectures": ["BertForMaskedLM"],
                                         "max_position_embeddings": 512}),
        "t5": _model_dir(ws / "t5", {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"],
                                     "is_encoder_decoder": True}),
        "no_weights": _model_dir(ws / "no_weights", llama, weights=False),
        "corrupt_config": str(Path(_write(ws / "corrupt_config" / "config.json", "{broken")).parent),
        "unknown_type": _model_dir(ws / "unknown_type", {"model_type": "no_such_architecture"}),
        "gguf_header_only": _write(ws / "gguf" / "header_only.gguf", data[:448]),
        "gguf_cut": _write(ws / "gguf" / "cut.gguf", data[:40]),
        "gguf_garbage": _write(ws / "gguf" / "garbage.gguf", b"\x00" * 100),
        "gguf_t5": _gguf(ws / "gguf" / "t5.gguf", "t5"),
        "gguf_rwkv": _gguf(ws / "gguf" / "rwkv.gguf", "rwkv6"),
        "task_broken_yaml": _write(ws / "tasks" / "broken.yaml", "task: [a, b\n"),
        "task_no_key": _yaml(ws / "tasks" / "no_key.yaml", {"dataset_path": "json"}),
        "task_bad_type": _task(ws, "bad_type", lambda c: c.update(output_type="bogus")),
        "task_unknown_field": _task(ws, "unknown_field", lambda c: c.update(foo_unknown=1)),
        "task_bad_template": _task(ws, "bad_template", lambda c: c.update(doc_to_text="{{nonexistent_field}}")),
        "task_no_acc": _task(ws, "no_acc", lambda c: c.update(
            metric_list=[{"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False}])),
        "calib_not_json": _write(ws / "calib" / "not_json.jsonl", '{"text": "a story"}\n{broken\n'),
        "calib_not_utf8": _write(ws / "calib" / "latin1.jsonl", '{"text": "caf\u00e9"}\n'.encode("latin-1")),
        "calib_no_text": _write(ws / "calib" / "numbers.jsonl", '{"n": 1}\n{"n": 2}\n'),
        "tiny_plan": _write(ws / "tiny_plan.json", json.dumps({"formats": summary["recommendation"]["formats"]})),
        **_summary_variants(ws, run),
        **_issue36_files(ws, run),
        **_runs_with_broken_storage(ws, run),
        **_issue54_files(ws, run),
        **_issue54_model_files(ws),
    }
    read_only = read_only_folder(ws)
    if read_only is not None:
        out["read_only"] = read_only
    return out
