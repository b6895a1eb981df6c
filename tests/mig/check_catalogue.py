#!/usr/bin/env python3
"""src/mig/catalogue_data.cc is what tools/gen_catalogue.py makes of data/mig-profiles.json (white space aside:
the checked-in file is clang-formatted). Exits 1 naming the first difference."""
import os
import re
import subprocess
import sys

repo = os.environ.get("DYNMIG_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
generated = subprocess.run([sys.executable, os.path.join(repo, "tools", "gen_catalogue.py")], check=True,
                           capture_output=True, text=True).stdout
checked_in = open(os.path.join(repo, "src", "mig", "catalogue_data.cc")).read()
squash = lambda text: re.sub(r"\s+", "", text)
a, b = squash(generated), squash(checked_in)
if a != b:
    at = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    print("src/mig/catalogue_data.cc differs from tools/gen_catalogue.py's output near: generated %r, checked in %r"
          % (a[max(0, at - 60):at + 60], b[max(0, at - 60):at + 60]))
    sys.exit(1)
print("src/mig/catalogue_data.cc matches data/mig-profiles.json")
