"""Which checkpoint reads a state: the English one or the multilingual one (`route`), and the
script and language detection behind that choice (`analyse`). Pure Python, no model is loaded."""

from laya.routing.decision import Route, route
from laya.routing.language import analyse

__all__ = ["Route", "analyse", "route"]
