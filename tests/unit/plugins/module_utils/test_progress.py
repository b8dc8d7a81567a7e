"""Progress of a long run: what the module writes (core/progress.py) and what the action plugin shows of it
(plugin_utils/progress.py), with a clock of our own (no threads, no sleeping)."""

import json
import os

from ansible_collections.machinery.compute.plugins.module_utils.core.progress import Progress
from ansible_collections.machinery.compute.plugins.plugin_utils.progress import Watcher


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Later:
    """The deferred writes a Progress asked for, run by hand."""

    def __init__(self):
        self.due = []

    def __call__(self, seconds, function):
        self.due.append((seconds, function))

    def run(self):
        due, self.due = self.due, []
        for _seconds, function in due:
            function()


def written(path):
    with open(path) as handle:
        return json.load(handle)


def test_a_machine_is_done_once_and_a_crowded_one_is_undone(tmp_path):
    path = str(tmp_path / "progress.json")
    later = Later()
    progress = Progress("machines", total=3, path=path, clock=Clock(), later=later)
    for name in ("a", "b", "c", "d", "e"):
        progress.begin(name)
    later.run()
    assert written(path)["message"] == "0 of 3 machines done; working on a, b, c (and 2 more)"
    progress.end("a")
    progress.end("a")  # deleted on two pools: one machine
    progress.end("b")
    progress.undo("b")  # crowded off its pool: placed again
    later.run()
    assert written(path)["done"] == 1
    assert written(path)["message"] == "1 of 3 machines done; working on c, d, e"
    assert sorted(os.listdir(tmp_path)) == ["progress.json"]  # written whole: no part left beside it
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


def test_a_burst_is_written_once_and_the_rest_when_the_interval_is_up(tmp_path):
    path = str(tmp_path / "progress.json")
    clock, later = Clock(), Later()
    progress = Progress("machines", total=100, path=path, every=0.5, clock=clock, later=later)
    progress.begin("a")
    assert written(path)["message"] == "0 of 100 machines done; working on a"  # the first is written at once
    clock.now += 0.1
    for name in ("b", "c"):
        progress.begin(name)
    progress.end("a")
    assert written(path)["message"] == "0 of 100 machines done; working on a"  # too soon: not yet
    assert [round(seconds, 3) for seconds, _function in later.due] == [0.4]  # one write due, when the 0.5 s are up
    clock.now += 0.4
    later.run()
    assert written(path)["message"] == "1 of 100 machines done; working on b, c"  # nothing is lost
    assert later.due == []
    clock.now += 0.6
    progress.end("b")
    assert written(path)["done"] == 2  # after a quiet spell, at once again
    assert later.due == []


def test_nothing_is_written_without_a_watcher(tmp_path, monkeypatch):
    monkeypatch.delenv("MACHINERY_PROGRESS_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    progress = Progress("machines", total=1)
    progress.begin("a")
    progress.end("a")
    assert os.listdir(tmp_path) == []


def test_a_watcher_that_went_away_does_not_fail_the_run(tmp_path):
    progress = Progress("machines", total=1, path=str(tmp_path / "gone" / "progress.json"))
    progress.begin("a")
    progress.end("a")
    assert progress.path is None


def test_the_watcher_shows_new_messages_and_repeats_after_a_quiet_spell(tmp_path):
    path = str(tmp_path / "progress.json")
    shown, clock = [], Clock()
    watcher = Watcher("machine_batch on localhost", path, show=shown.append, first=4, gap=2, quiet=8, clock=clock)
    assert watcher.poll() is None  # nothing written yet
    progress = Progress("machines", total=2, path=path, clock=clock)
    progress.begin("a")
    clock.now += 1
    assert watcher.poll() is None  # a short run says nothing
    clock.now += 3
    assert watcher.poll() == "machine_batch on localhost: 0 of 2 machines done; working on a (4s)"
    progress.end("a")
    clock.now += 1
    assert watcher.poll() is None  # new, but too soon after the last
    clock.now += 1
    assert watcher.poll() == "machine_batch on localhost: 1 of 2 machines done (6s)"
    clock.now += 7
    assert watcher.poll() is None
    clock.now += 1
    assert watcher.poll() == "machine_batch on localhost: 1 of 2 machines done (14s)"  # quiet for 8 s: said again
    assert len(shown) == 3


def test_a_torn_read_keeps_the_last_message(tmp_path):
    path = tmp_path / "progress.json"
    shown, clock = [], Clock()
    watcher = Watcher("x", str(path), show=shown.append, first=0, gap=0, quiet=8, clock=clock)
    path.write_text(json.dumps({"message": "1 of 2 machines done"}))
    assert watcher.poll() == "x: 1 of 2 machines done (0s)"
    path.write_text('{"message": "2 of')
    clock.now += 9
    assert watcher.poll() == "x: 1 of 2 machines done (9s)"
