"""The library the course notebooks import.

``import course; course.setup()`` is every notebook's first code cell: it picks GPU or Triton
interpreter mode and says which.
"""

from course.runtime import Runtime, detect, setup

__all__ = ["Runtime", "detect", "setup"]
