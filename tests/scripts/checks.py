"""What the Python test scripts share: expectations that failed are kept, then reported together
with the exit status."""
import sys


class Checks:
    def __init__(self):
        self.failures = []

    def expect(self, what, cond):
        if not cond:
            self.failures.append(what)

    def finish(self, name):
        for f in self.failures:
            print("FAIL", f, file=sys.stderr)
        if not self.failures:
            print(f"{name}: all checks passed")
        sys.exit(1 if self.failures else 0)
