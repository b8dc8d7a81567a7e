"""Writes LAB_DIR/lab-newer-first.json: the lab's lab.json with the pools of a newer release (lab.py --newer)
first, so that test files acting on their lab's first pool act on a newer host (make integration's mixed fleet).
Usage: python3 newer_first.py LAB_DIR..."""

import json
import os
import sys


def main(lab_dirs):
    for lab_dir in lab_dirs:
        with open(os.path.join(lab_dir, "lab.json")) as handle:
            lab = json.load(handle)
        newer = [pool for pool in lab["pools"] if pool.get("debian_root")]
        if not newer:
            sys.exit("%s has no pool of a newer release (lab.py up --newer N)" % lab_dir)
        lab["pools"] = newer + [pool for pool in lab["pools"] if not pool.get("debian_root")]
        with open(os.path.join(lab_dir, "lab-newer-first.json"), "w") as handle:
            json.dump(lab, handle, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
