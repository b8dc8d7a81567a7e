"""Copy the files' times of a make integration run into durations.json, the order the files go to the labs in:

    python3 tests/integration/durations.py MEASURED.json DURATIONS.json

MEASURED.json is what the suite's conftest writes where MACHINERY_DURATIONS_OUT names (make integration:
tests/output/integration-durations.json). A file that had a failure, or did not run, keeps the time it had.
"""

import json
import sys


def main(measured_path, durations_path):
    with open(measured_path, encoding="utf-8") as handle:
        measured = json.load(handle)
    with open(durations_path, encoding="utf-8") as handle:
        seconds = json.load(handle)
    failed = set(measured["failed"])
    for name, spent in measured["seconds"].items():
        if name in failed:
            print("%s: had a failure, keeps %s s (measured %.0f s)" % (name, seconds.get(name, "no time"), spent))
            continue
        seconds[name] = round(spent)
    with open(durations_path, "w", encoding="utf-8") as handle:
        json.dump(dict(sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))), handle, indent=1)
        handle.write("\n")
    print("%s: the times of %d files" % (durations_path, len(set(measured["seconds"]) - failed)))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
