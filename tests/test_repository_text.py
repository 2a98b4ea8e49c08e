"""The repository reads as a product: no tracked file speaks of how the work was organised (work sessions, numbered
calls to a GPU machine, its minutes), and no Markdown link leads out of the checkout or to a file it lacks. Fast:
reads files, starts no trainer."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Words about the work process, not about the project. Measurements say date, commit, GPU and versions instead.
# (the phrase "device" + "call" is split so that this line does not match itself)
WORK_LOG = re.compile(r"sessions? ?[0-9]|device (tool|minutes|time)|device " r"calls?\b|calls? [0-9]+", re.IGNORECASE)
# (path, a substring of the line) pairs where the words mean something else; keep this short and say why.
ALLOWED = ()
SKIP_DIRS = {".git", ".venv", "outputs", "multirun", "__pycache__", ".pytest_cache", ".whl", "node_modules"}
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def tracked_files():
    """The tracked files (git ls-files); outside a git checkout, every file under the root but the build and run
    folders, so the test still reads the project."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
        if files:
            return [f for f in files if os.path.isfile(os.path.join(ROOT, f))]
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for d, dirs, names in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.endswith(".egg-info")]
        found += [os.path.relpath(os.path.join(d, n), ROOT) for n in names]
    return found


def read_text(rel):
    try:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return None  # binary files say nothing


# a line break inside a comment or paragraph, with the comment marks of the next line
BREAK = re.compile(r"[ \t]*\n[ \t#*/>-]*")


def work_log_lines(rel, text):
    """The lines that match, and matches that a line break splits (reported at the line they start on)."""
    lines = text.splitlines()
    hits = {i: line for i, line in enumerate(lines, 1)
            if WORK_LOG.search(line) and not any(rel == p and s in line for p, s in ALLOWED)}
    for i, (a, b) in enumerate(zip(lines, lines[1:]), 1):
        joined = BREAK.sub(" ", a + "\n" + b)
        if i not in hits and i + 1 not in hits and WORK_LOG.search(joined) \
                and not any(rel == p and (s in a or s in b) for p, s in ALLOWED):
            hits[i] = joined
    return [f"{rel}:{i}: {line.strip()[:160]}" for i, line in sorted(hits.items())]


def broken_links(rel, text):
    """Relative links of a Markdown file that resolve outside the root or to nothing."""
    out = []
    base = os.path.dirname(os.path.join(ROOT, rel))
    root = os.path.realpath(ROOT)
    for target in LINK.findall(text):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor in the same page
        path = target.split("#", 1)[0]
        dest = os.path.realpath(os.path.join(base, path))
        if os.path.commonpath([root, dest]) != root:
            out.append(f"{rel}: ({target}) leads outside the repository")
        elif not os.path.exists(dest):
            out.append(f"{rel}: ({target}) names a file the repository lacks")
    return out


@pytest.mark.e2e  # runs `git ls-files`
def test_no_tracked_file_speaks_of_the_work_process():
    hits = []
    for rel in tracked_files():
        text = read_text(rel)
        if text is not None:
            hits += work_log_lines(rel, text)
    assert not hits, "say the date, commit, GPU and versions instead:\n" + "\n".join(hits)


@pytest.mark.e2e  # runs `git ls-files`
def test_markdown_links_stay_inside_the_repository_and_resolve():
    md = [f for f in tracked_files() if f.endswith(".md")]
    assert "README.md" in md and "docs/guide.md" in md
    bad = []
    for rel in md:
        bad += broken_links(rel, read_text(rel) or "")
    assert not bad, "\n".join(bad)


# built from parts, so that this file does not match the pattern it tests
@pytest.mark.parametrize("line", [f"measured in session {4}", f"Session{12} figures", "the device " + "time ran out",
                                  "28 of 30 device " + "minutes", "through the device " + "tool",
                                  f"call {3}: the table", f"calls {2}-{3}", f"sessions {5}-{6}", "each device " + "call carries"])
def test_the_work_log_pattern_catches(line):
    assert work_log_lines("x.md", line)
    # split over two comment lines, as a wrapped comment splits it
    first, rest = line.rsplit(" ", 1)
    assert work_log_lines("x.py", f"# {first}\n# {rest}")


@pytest.mark.parametrize("line", ["a pytest session fixture", "sessions of a Slurm cluster", "the first call's scale",
                                  "callable(fn)", "device-side kernels only", "GPU time per call"])
def test_the_work_log_pattern_spares(line):
    assert not work_log_lines("x.md", line)


def test_the_link_check_catches_links_out_and_dangling(tmp_path):
    text = "[guide](../elsewhere/guide.txt) [gone](docs/nothing_here.md) [ok](docs/guide.md) " \
           "[web](https://example.com/x) [anchor](#section) [ok with anchor](README.md#quick-start)"
    bad = broken_links("README.md", text)
    assert len(bad) == 2
    assert "outside" in bad[0] and "lacks" in bad[1]
