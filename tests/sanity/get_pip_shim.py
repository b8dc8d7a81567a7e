"""Stand-in for the get-pip.py bootstrap script that ansible-test downloads from a host we cannot reach.

ansible-test runs the cached script as __main__ inside a fresh virtual environment, with pip-install style
arguments (options and packages such as pip==24.2). We bootstrap pip from the interpreter's own bundled wheel
(ensurepip) and then let that pip install what was asked for from the package index.
"""

import subprocess
import sys

GET_PIP_ONLY_OPTIONS = {"--no-setuptools", "--no-wheel"}


def main():
    # In a process of its own: ensurepip points PIP_CONFIG_FILE at /dev/null in the environment it runs in,
    # which would hide the pip configuration (index, certificates) from the install below.
    subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"])
    arguments = [argument for argument in sys.argv[1:] if argument not in GET_PIP_ONLY_OPTIONS]
    sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"] + arguments))


main()
