"""Checks that docs/configuration.md documents every option of src/config/ once, and
that docs/observability.md documents every metric of src/ once, with its labels.

Options:
- An option table is a markdown table whose header names a `flag` and an `env var`
  column; each of its rows documents the option named in those two cells (a `--flag`
  and an environment variable). Tables with other headers (commands, the secrets and
  their file forms) are not option tables and are skipped, and so are fenced code
  blocks.
- No flag and no environment variable is the key of more than one row. A row that
  looks like an option row but stands outside a table (no header and `|---|` line
  above it, e.g. rows pasted after a paragraph) is counted as well, and reported.
- Every `env = "…"` of a clap `#[arg(…)]` in any `.rs` file under src/config/ (the
  command line in mod.rs, one file per group of options) has exactly one row, and
  every environment variable with a row is one of them. Where the arg's flag and a
  simple default (`default_value`/`default_value_t`) can be read, the row must name
  the same flag and, when its default is one literal, the same default.

Metrics:
- A metric table of docs/observability.md is a markdown table whose first column is
  named `metric`; each of its rows documents one metric, named in that cell as one
  code span, `name` or `name{label,label}`, with its type in the `type` column.
- Every metric registered in any `.rs` file under src/ has exactly one row, with the
  labels it is registered with (in any order) and its type (counter, gauge or
  histogram), and every metric with a row is registered. A registration is a call of
  one of the registry's helpers (`.counter("authd_…", help)`, `.counter_vec(…,
  &["label", …])`, `.gauge`, `.gauge_vec`, `.float_gauge_vec`, `.histogram`,
  `.histogram_vec`) or a `Opts::new("…")`/`HistogramOpts::new("…")` given to a
  prometheus type, its name a string literal; the process collector of the
  prometheus crate (`ProcessCollector`) adds its own seven `process_*` gauges and
  counter.

Standard library only. Run by .ci/run: `python3 .ci/check-docs.py [DOC [CONFIG_DIR]]`
(DOC and CONFIG_DIR are the options' page and source, CONFIG_DIR may also name one
`.rs` file; the metrics are always docs/observability.md against src/).
"""

import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
doc_path = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "docs/configuration.md"
src_path = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else root / "src/config"


def shown(path):
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


DOC, SRC = shown(doc_path), shown(src_path)

ENV_TOKEN = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]\b")
FLAG_TOKEN = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
SEPARATOR = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def cells(line):
    """The cells of a table line, `|`s inside backticks included in their cell."""
    text = line.strip()
    if text.startswith("|"):
        text = text[1:]
    if text.endswith("|") and not text.endswith("\\|"):
        text = text[:-1]
    out, current, in_code = [], [], False
    for i, ch in enumerate(text):
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code and (i == 0 or text[i - 1] != "\\"):
            out.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    out.append("".join(current).strip())
    return out


# --- src/config/ ---------------------------------------------------------------------


def strip_comments(text):
    """The source with `//` comments blanked (strings kept), line numbers unchanged."""
    out, i, n = [], 0, len(text)
    in_str = False
    while i < n:
        ch = text[i]
        if in_str:
            out.append(ch)
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if ch == '"':
                in_str = False
        elif ch == "r" and re.match(r'r#*"', text[i:]) and not re.match(r"\w", text[i - 1 : i]):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)  # a raw string, r#"…"#
            end = text.find('"' + hashes, i + len(hashes) + 2)
            end = n if end < 0 else end + 1 + len(hashes)
            out.append(text[i:end])
            i = end
            continue
        elif ch == '"':
            in_str = True
            out.append(ch)
        elif ch == "'" and re.match(r"'(\\.|[^\\'])'", text[i : i + 4]):
            char = re.match(r"'(\\.|[^\\'])'", text[i : i + 4]).group(0)  # '"' is no string
            out.append(char)
            i += len(char)
            continue
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("".join(c if c == "\n" else " " for c in text[i:end]))
            i = end
            continue
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def call_arguments(code, open_paren):
    """The top-level arguments of the call whose `(` is at `open_paren`, and the offset
    after its `)`; None when the parentheses do not balance."""
    depth, i, in_str, start, args = 1, open_paren + 1, False, open_paren + 1, []
    while i < len(code):
        ch = code[i]
        if in_str:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                args.append(code[start:i].strip())
                return [a for a in args if a], i + 1
        elif ch == "," and depth == 1:
            args.append(code[start:i].strip())
            start = i + 1
        i += 1
    return None


def arg_attributes(code):
    """(start offset, attribute body, field name or None) of every `#[arg(…)]`."""
    for match in re.finditer(r"#\[\s*arg\s*\(", code):
        found = call_arguments(code, match.end() - 1)
        if found is None:  # unbalanced (a file being edited): the env regex below still sees it
            continue
        i = found[1]
        body = code[match.end() : i - 1]
        # The field it annotates: the next `name:` after any further attributes.
        rest = code[i:]
        field = re.match(
            r"\s*\](?:\s*#\[[^\]]*\])*\s*(?:pub(?:\([^)]*\))?\s+)?([a-z_][a-z0-9_]*)\s*:", rest
        )
        yield match.start(), body, field.group(1) if field else None


def string_value(body, key):
    found = re.search(rf"(?<![\w]){key}\s*=\s*\"((?:[^\"\\]|\\.)*)\"", body)
    return found.group(1) if found else None


src_files = sorted(src_path.rglob("*.rs")) if src_path.is_dir() else [src_path]
if not src_files:
    sys.exit(f"{SRC}: no .rs file in it; has the configuration moved?")

# Every env = "…" of the files, whatever surrounds it: the list the docs must cover,
# each with where it stands ("src/config/store.rs:42").
src_envs = {}
# What can be read of each one's arg: its flag and a simple default.
src_flag, src_default = {}, {}
for file in src_files:
    try:
        code = strip_comments(file.read_text(encoding="utf-8"))
    except OSError as e:
        sys.exit(f"{shown(file)}: cannot read it: {e}")

    def src_line(offset):
        return f"{shown(file)}:{code.count(chr(10), 0, offset) + 1}"

    for match in re.finditer(r"(?<![\w])env\s*=\s*\"([A-Z][A-Z0-9_]*)\"", code):
        src_envs.setdefault(match.group(1), src_line(match.start()))

    for start, body, field in arg_attributes(code):
        env = string_value(body, "env")
        if not env:
            continue
        long = string_value(body, "long")
        if long is None and re.search(r"(?<![\w])long\s*(,|$)", body) and field:
            long = field.replace("_", "-")
        if long:
            src_flag[env] = "--" + long
        default = string_value(body, "default_value")
        if default is None:
            typed = re.search(r"(?<![\w])default_value_t\s*=\s*([A-Za-z0-9_.]+)\s*(,|$)", body)
            if typed and re.fullmatch(r"[0-9_]+|true|false|[0-9_]*\.[0-9_]+", typed.group(1)):
                default = typed.group(1)
        if default is not None:
            src_default[env] = default

if not src_envs:
    sys.exit(f'{SRC}: no `env = "…"` found in any #[arg(…)]; has the configuration moved?')

# --- docs/configuration.md -----------------------------------------------------------

try:
    doc_lines = doc_path.read_text(encoding="utf-8").splitlines()
except OSError as e:
    sys.exit(f"{DOC}: cannot read it: {e}")


def column(header, *names):
    """The index of the header's column of one of these names, or None."""
    for i, name in enumerate(header):
        if name.strip("` *").lower() in names:
            return i
    return None


def cell(row, index):
    return row[index] if index is not None and index < len(row) else ""


rows = []  # (line number, flags, envs, default cell)
stray = []
header = None  # the cells of the current table's header, None outside tables
in_fence = False
for number, line in enumerate(doc_lines, 1):
    text = line.strip()
    if re.match(r"^(```|~~~)", text):
        in_fence = not in_fence
        header = None
        continue
    if in_fence:
        continue
    if not text.startswith("|"):
        header = None
        continue
    previous = doc_lines[number - 2].strip() if number >= 2 else ""
    following = doc_lines[number].strip() if number < len(doc_lines) else ""
    if SEPARATOR.match(text):
        continue
    if SEPARATOR.match(following) and not (previous.startswith("|") and header is not None):
        header = cells(text)  # a table starts here
        continue
    row = cells(text)
    if header is None:
        # No header above: only an option row when it is laid out as one (a --flag
        # first, then an environment variable).
        if len(row) >= 2 and FLAG_TOKEN.search(row[0]) and ENV_TOKEN.search(row[1]):
            stray.append(number)
            rows.append((number, FLAG_TOKEN.findall(row[0]), ENV_TOKEN.findall(row[1]),
                         row[2] if len(row) > 2 else ""))
        continue
    flag_col = column(header, "flag", "flags")
    env_col = column(header, "env var", "env", "environment variable")
    if flag_col is None or env_col is None:
        continue  # not an option table
    default_col = column(header, "default")
    rows.append((number, FLAG_TOKEN.findall(cell(row, flag_col)),
                 ENV_TOKEN.findall(cell(row, env_col)), cell(row, default_col)))

problems = []
runs = []  # consecutive stray lines, as [first, last]
for number in stray:
    if runs and runs[-1][1] == number - 1:
        runs[-1][1] = number
    else:
        runs.append([number, number])
for first, last in runs:
    where = f"line {first}" if first == last else f"lines {first}-{last}"
    problems.append(f"{DOC}: {where}: option rows outside any table (no header and |---| "
                    "line above them): move them into their section's table")

by_env, by_flag = {}, {}
for number, flags, envs, _ in rows:
    if not flags and not envs:
        problems.append(f"{DOC}:{number}: an option row that names no flag and no "
                        "environment variable")
    for env in dict.fromkeys(envs):
        by_env.setdefault(env, []).append(number)
    for flag in dict.fromkeys(flags):
        by_flag.setdefault(flag, []).append(number)

# One message per set of rows: a flag and its variable duplicated together are one option.
duplicates = {}
for key, numbers in list(by_env.items()) + list(by_flag.items()):
    if len(numbers) > 1:
        duplicates.setdefault(tuple(numbers), []).append(key)
for numbers, keys in sorted(duplicates.items()):
    problems.append(f"{DOC}: {' / '.join(keys)} is documented {len(numbers)} times, lines "
                    f"{', '.join(map(str, numbers))}: keep the row that agrees with {SRC}")

def where_key(where):
    """A "path:line" sorted by path, then by line as a number."""
    path, line = where.rsplit(":", 1)
    return path, int(line)


for env, line in sorted(src_envs.items(), key=lambda item: where_key(item[1])):
    if env not in by_env:
        flag = f" ({src_flag[env]})" if env in src_flag else ""
        problems.append(f"{line}: {env}{flag} has no row in {DOC}")
for env, numbers in sorted(by_env.items()):
    if env not in src_envs:
        problems.append(f"{DOC}:{numbers[0]}: {env} has a row, but no "
                        f'env = "{env}" in {SRC}')


def normal(value):
    """A default as compared: 100_000 and 100000 are one number."""
    return value.replace("_", "") if re.fullmatch(r"[0-9_.]+", value) else value


def literal(cell):
    """The default cell's value when it is exactly one `literal`, else None."""
    found = re.fullmatch(r"`([^`]*)`", cell.strip())
    return normal(found.group(1)) if found else None


for number, flags, envs, default in rows:
    for env in envs:
        if env not in src_envs:
            continue
        want = src_flag.get(env)
        if want and flags and want not in flags:
            problems.append(f"{DOC}:{number}: {env} is documented with {', '.join(flags)}, "
                            f"but its flag in {src_envs[env]} is {want}")
        doc_default = literal(default)
        if env in src_default and doc_default is not None \
                and doc_default != normal(src_default[env]):
            problems.append(f"{DOC}:{number}: {env} is documented with the default "
                            f"`{doc_default}`, but {src_envs[env]} says "
                            f"\"{src_default[env]}\"")

option_problems = problems

# --- metrics: src/ against docs/observability.md ----------------------------------------

METRICS_DOC_PATH = root / "docs/observability.md"
METRICS_SRC_PATH = root / "src"
METRICS_DOC, METRICS_SRC = shown(METRICS_DOC_PATH), shown(METRICS_SRC_PATH)

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# The registry's helpers (src/metrics/mod.rs, `Families`), by the type they register.
HELPERS = {
    "counter": "counter",
    "counter_vec": "counter",
    "gauge": "gauge",
    "gauge_vec": "gauge",
    "float_gauge_vec": "gauge",
    "histogram": "histogram",
    "histogram_vec": "histogram",
}
# A prometheus type given an `Opts::new(…)` of its own, by the type it registers.
PROMETHEUS_TYPES = {
    "Counter": "counter", "IntCounter": "counter", "CounterVec": "counter",
    "IntCounterVec": "counter", "Gauge": "gauge", "IntGauge": "gauge",
    "GaugeVec": "gauge", "IntGaugeVec": "gauge", "Histogram": "histogram",
    "HistogramVec": "histogram",
}
# What the prometheus crate's process collector registers (its process_collector.rs).
PROCESS_METRICS = {
    "process_cpu_seconds_total": "counter",
    "process_open_fds": "gauge",
    "process_max_fds": "gauge",
    "process_virtual_memory_bytes": "gauge",
    "process_resident_memory_bytes": "gauge",
    "process_start_time_seconds": "gauge",
    "process_threads": "gauge",
}


def literal_name(argument):
    """The metric name of a string-literal argument, else None."""
    found = re.fullmatch(r'"([^"\\]*)"', argument)
    if found and METRIC_NAME.fullmatch(found.group(1)):
        return found.group(1)
    return None


def literal_labels(argument):
    """The labels of a `&["a", "b"]` argument, else None."""
    found = re.fullmatch(r"&\s*\[\s*((?:\"[^\"]*\"\s*,?\s*)*)\]", argument)
    if not found:
        return None
    return re.findall(r'"([^"]*)"', found.group(1))


def plain(code):
    """`code` with raw strings and character literals replaced by ones that hold no quote
    or bracket, line numbers unchanged, so that the scanners below need know only
    plain strings."""
    code = re.sub(r'(?<![\w])r(#+)"(.*?)"\1',
                  lambda m: '"' + "\n" * m.group(2).count("\n") + '"', code, flags=re.S)
    return re.sub(r"'(\\.|[^\\'\n])'", "'_'", code)


def without_tests(code):
    """`code` with each `#[cfg(test)] mod … { … }` blanked (line numbers unchanged): a
    registry a unit test builds for itself is not the server's."""
    out, last = [], 0
    for match in re.finditer(r"#\[\s*cfg\s*\(\s*test\s*\)\s*\]\s*(?:pub(?:\([^)]*\))?\s+)?"
                             r"mod\s+\w+\s*\{", code):
        if match.start() < last:
            continue
        found = call_arguments(code, match.end() - 1)
        i = found[1] if found else len(code)  # unbalanced: blank to the end
        out.append(code[last:match.start()])
        out.append("".join(c if c == "\n" else " " for c in code[match.start():i]))
        last = i
    out.append(code[last:])
    return "".join(out)


# name -> {"labels": [...] or None, "type": …, "where": "src/…:line"}
registered = {}
metric_problems = []


def register(name, kind, labels, where):
    if name in registered:
        first = registered[name]
        if (first["type"], sorted(first["labels"] or [])) != (kind, sorted(labels or [])):
            metric_problems.append(f"{where}: {name} is registered again, with another type "
                                   f"or other labels than at {first['where']}")
        return
    registered[name] = {"labels": labels, "type": kind, "where": where}


metric_src_files = sorted(METRICS_SRC_PATH.rglob("*.rs"))
if not metric_src_files:
    sys.exit(f"{METRICS_SRC}: no .rs file in it; has the source moved?")
for file in metric_src_files:
    try:
        code = without_tests(plain(strip_comments(file.read_text(encoding="utf-8"))))
    except OSError as e:
        sys.exit(f"{shown(file)}: cannot read it: {e}")

    def where(offset):
        return f"{shown(file)}:{code.count(chr(10), 0, offset) + 1}"

    for match in re.finditer(r"\.\s*(" + "|".join(HELPERS) + r")\s*\(", code):
        parsed = call_arguments(code, match.end() - 1)
        if not parsed or not parsed[0]:
            continue
        args = parsed[0]
        name = literal_name(args[0])
        if name is None:
            continue  # the helpers' own definitions, which pass a variable on
        helper = match.group(1)
        labels = []
        if helper.endswith("_vec"):
            labels = literal_labels(args[-1]) if len(args) >= 3 else None
            if labels is None:
                metric_problems.append(f"{where(match.start())}: {name}'s labels are not a "
                                       '&["…", …] list of literals: this check cannot read them')
        register(name, HELPERS[helper], labels, where(match.start()))

    for match in re.finditer(r"\b(?:prometheus::)?(Histogram)?Opts::new\s*\(", code):
        parsed = call_arguments(code, match.end() - 1)
        if not parsed or not parsed[0]:
            continue
        args, after = parsed
        name = literal_name(args[0])
        if name is None:
            continue
        # The type it is given to: `Gauge::with_opts(Opts::new(…))` or
        # `IntCounterVec::new(Opts::new(…), &["label"])`.
        given = re.search(r"(?:prometheus::)?(\w+)::(with_opts|new)\s*\(\s*$",
                          code[max(0, match.start() - 200):match.start()])
        kind = PROMETHEUS_TYPES.get(given.group(1)) if given else None
        if kind is None:
            metric_problems.append(f"{where(match.start())}: {name}: the prometheus type it is "
                                   "given to cannot be read here")
            continue
        labels = []
        if given.group(1).endswith("Vec"):
            rest = re.match(r"\s*,\s*(&\s*\[[^\]]*\])", code[after:])
            labels = literal_labels(rest.group(1)) if rest else None
            if labels is None:
                metric_problems.append(f"{where(match.start())}: {name}'s labels are not a "
                                       '&["…", …] list of literals: this check cannot read them')
        register(name, kind, labels, where(match.start()))

    process = re.search(r"\bProcessCollector\b", code)
    if process:
        for name, kind in PROCESS_METRICS.items():
            register(name, kind, [], where(process.start()))

if not registered:
    sys.exit(f"{METRICS_SRC}: no metric registration found; have the metrics moved?")

try:
    metric_doc_lines = METRICS_DOC_PATH.read_text(encoding="utf-8").splitlines()
except OSError as e:
    sys.exit(f"{METRICS_DOC}: cannot read it: {e}")

METRIC_CELL = re.compile(r"`([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([a-z0-9_,\s]*)\})?`")
documented = {}  # name -> [(line, labels, type)]
header, in_fence = None, False
for number, line in enumerate(metric_doc_lines, 1):
    text = line.strip()
    if re.match(r"^(```|~~~)", text):
        in_fence, header = not in_fence, None
        continue
    if in_fence or not text.startswith("|"):
        header = None
        continue
    following = metric_doc_lines[number].strip() if number < len(metric_doc_lines) else ""
    if SEPARATOR.match(text):
        continue
    if header is None:
        if SEPARATOR.match(following):
            header = cells(text)
        continue
    if column(header, "metric") != 0:
        continue  # not a table of metrics (the bottleneck's places, the alerts)
    row = cells(text)
    spans = re.findall(r"`[^`]*`", row[0])
    named = [METRIC_CELL.fullmatch(span) for span in spans]
    if len(spans) != 1 or not named[0]:
        metric_problems.append(f"{METRICS_DOC}:{number}: a metric row names "
                               f"{len(spans)} code spans ({row[0]}): one row per metric, "
                               "its cell `name` or `name{label,…}`")
        continue
    name, label_text = named[0].group(1), named[0].group(2)
    labels = [l.strip() for l in label_text.split(",") if l.strip()] if label_text else []
    kind = cell(row, column(header, "type")).strip("` ").lower() or None
    documented.setdefault(name, []).append((number, labels, kind))


def label_list(labels):
    return "{" + ",".join(labels) + "}" if labels else "no labels"


for name, info in sorted(registered.items(), key=lambda item: where_key(item[1]["where"])):
    rows = documented.get(name)
    if not rows:
        labels = info["labels"] or []
        metric_problems.append(f"{info['where']}: {name} ({info['type']}, "
                               f"{label_list(labels)}) has no row in {METRICS_DOC}")
        continue
    if len(rows) > 1:
        metric_problems.append(f"{METRICS_DOC}: {name} is documented {len(rows)} times, lines "
                               f"{', '.join(str(r[0]) for r in rows)}: keep one row, with "
                               "every label")
    for number, labels, kind in rows:
        if info["labels"] is not None and sorted(labels) != sorted(info["labels"]):
            metric_problems.append(f"{METRICS_DOC}:{number}: {name} is documented with "
                                   f"{label_list(labels)}, but {info['where']} registers it "
                                   f"with {label_list(info['labels'])}")
        if kind is not None and kind != info["type"]:
            metric_problems.append(f"{METRICS_DOC}:{number}: {name} is documented as a {kind}, "
                                   f"but {info['where']} registers a {info['type']}")
for name, rows in sorted(documented.items(), key=lambda item: item[1][0][0]):
    if name not in registered:
        metric_problems.append(f"{METRICS_DOC}:{rows[0][0]}: {name} has a row, but nothing "
                               f"in {METRICS_SRC} registers it")

# --- the verdict ----------------------------------------------------------------------

failed = False
for page, problems, fine in (
    (DOC, option_problems, f"{len(by_env)} options, each documented once"),
    (METRICS_DOC, metric_problems,
     f"{len(registered)} metrics, each documented once with its labels and type"),
):
    if problems:
        failed = True
        print(f"{page}: {len(problems)} problem(s):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
    else:
        print(f"{page}: {fine}")
sys.exit(1 if failed else 0)
