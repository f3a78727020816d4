"""The grader's nbgrader (``autograder.host.nbgrader_main``) validates a notebook's grading
metadata as stock nbgrader does: the same cells pass, the same errors are raised."""

from __future__ import annotations

import copy

import jsonschema
import pytest
from nbformat.v4 import new_code_cell
from nbgrader.nbgraderformat import MetadataValidator, common

from autograder.host.nbgrader_main import preload

GRADED = {"grade": True, "solution": False, "locked": True, "points": 2,
          "grade_id": "test_sizes", "schema_version": 3, "task": False}
BROKEN = {
    "points as text": {**GRADED, "points": "two"},
    "no grade id": {k: v for k, v in GRADED.items() if k != "grade_id"},
    "an unknown key's type": {**GRADED, "locked": "yes"},
}


def _errors(cells: list) -> list:
    found = []
    for cell in cells:
        try:
            MetadataValidator().validate_cell(cell)
            found.append(None)
        except jsonschema.ValidationError as error:
            found.append((error.message, list(error.path)))
    return found


def test_metadata_is_validated_as_stock_nbgrader_validates_it(monkeypatch):
    cells = [new_code_cell("x = 1", metadata={"nbgrader": copy.deepcopy(meta)})
             for meta in [GRADED, *BROKEN.values()]]
    stock = _errors(cells)
    assert stock[0] is None and None not in stock[1:]
    monkeypatch.setattr(common, "jsonschema", common.jsonschema)  # undone after the test
    preload()
    assert common.jsonschema is not jsonschema
    assert _errors(cells) == stock
    assert _errors(cells) == stock  # and again, the schema checked already


def test_an_invalid_schema_is_still_refused(monkeypatch):
    monkeypatch.setattr(common, "jsonschema", common.jsonschema)
    preload()
    with pytest.raises(jsonschema.SchemaError):
        common.jsonschema.validate({}, {"type": 12})
