"""How pystrads declares and checks its estimators' params, and the params they all share.

- :class:`Rule` and its makers :func:`at_least`, :func:`above`, :func:`within`, :func:`one_of`:
  the valid values of a param as data (scikit-learn's ``_parameter_constraints`` is the
  model).  A failed rule raises :class:`~pystrads.errors.ConfigurationError` naming the param,
  its value, the valid values and, where given, a ``note`` with the fix.
- :data:`COMMON_RULES`: the rules of the MLlib params every estimator means the same by
  (``maxIter``, ``numWorkers``, ``checkpointInterval``, ``regParam``, ``tol``, ``stepSize``).
- :class:`ColumnKind` (:data:`NUMBERS`, :data:`VECTORS`): what an input column must hold.
- :class:`_StradsParams`: the base of every pystrads Params mixin.  A mixin declares its
  Params, ``_setDefault`` s them in ``__init__`` (as pyspark's ``_XxxParams`` do), and lists
  its ``_param_rules`` and ``_column_kinds``; the base gives each declared Param its
  ``get<Name>``, checks the rules of the whole MRO (:meth:`_StradsParams._check_params`, no
  Spark job) and the input columns (:meth:`_StradsParams._check_columns`).  Adding a param
  is its declaration, its default, its ``__init__`` argument and, if it has one, its rule.
- :class:`MLlibOnly`: an MLlib param a drop-in takes but does not honour (its documented
  gap), declared in a mixin's ``_mllib_only``: set, a fit logs a warning saying what pystrads
  does instead, or refuses it before any Spark job, naming the alternative.
- :class:`HasNumWorkers`: ``numWorkers``, the param pystrads adds to MLlib's shared ones.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, Dict, List, Union

from pyspark.ml.param import Param, Params, TypeConverters

from ..errors import ConfigurationError, InputError


def accessor_name(prefix: str, param: str) -> str:
    """``get`` / ``set`` + the param's name with a capital (MLlib's convention)."""
    return prefix + param[0].upper() + param[1:]


def add_accessor(cls: type, prefix: str, param: str) -> None:
    """Gives ``cls`` the ``get<Name>`` or ``set<Name>`` of ``param`` unless it (or a base) has one."""
    name = accessor_name(prefix, param)
    if hasattr(cls, name):
        return
    if prefix == "get":
        def accessor(self):
            return self.getOrDefault(param)
        accessor.__doc__ = f"Gets the value of ``{param}`` or its default value."
    else:
        def accessor(self, value):
            return self._set(**{param: value})
        accessor.__doc__ = f"Sets the value of ``{param}``; returns this instance."
    accessor.__name__ = name
    accessor.__qualname__ = f"{cls.__qualname__}.{name}"
    accessor.__module__ = cls.__module__
    setattr(cls, name, accessor)


# ----------------------------------------------------------------------------- rules
Bound = Union[float, str]  # a number, or the name of another param whose value is the bound


@dataclasses.dataclass(frozen=True)
class MLlibOnly:
    """An MLlib param that a drop-in accepts, so that code written for MLlib runs unchanged,
    but does not honour.  Set to a value outside ``honoured``, a fit logs a warning
    ``"<Estimator>: name=value is ignored with <instead>"``, or -- ``refused`` -- raises
    :class:`~pystrads.errors.ConfigurationError` before any Spark job:
    ``"name=value is not supported: <instead>"`` (which then names the alternative)."""

    instead: str
    refused: bool = False
    honoured: tuple = ()

    def applies(self, params: Params, name: str) -> bool:
        """Whether ``params`` set ``name`` to a value this gap concerns."""
        if not (params.hasParam(name) and params.isSet(name)):
            return False
        value = params.getOrDefault(name)
        return value is not None and value not in self.honoured


@dataclasses.dataclass(frozen=True)
class Rule:
    """The valid values of one param: ``ok(value, params)``, and ``says`` -- what a valid value
    is, as the message shows it after ``name=value`` (a string, or ``fn(params)``)."""

    ok: Callable[[Any, Params], bool]
    says: Union[str, Callable[[Params], str]]

    def check(self, params: Params, name: str) -> None:
        value = params.getOrDefault(name)
        if not self.ok(value, params):
            says = self.says(params) if callable(self.says) else self.says
            raise ConfigurationError(f"{name}={value!r} {says}")


def _value(bound: Bound, params: Params) -> float:
    return params.getOrDefault(bound) if isinstance(bound, str) else bound


def _shown(bound: Bound, params: Params) -> str:
    return f"{bound} ({params.getOrDefault(bound)!r})" if isinstance(bound, str) else str(bound)


def _number(value: Any, finite: bool) -> bool:
    return isinstance(value, (int, float)) and (not finite or math.isfinite(value))


def _noted(text: str, note: str) -> str:
    return f"{text} ({note})" if note else text


def at_least(low: Bound, *, finite: bool = False, note: str = "") -> Rule:
    """``value >= low`` (``low``: a number or another param's name); ``finite``: and finite."""
    kind = "a finite number " if finite else ""
    return Rule(lambda v, p: _number(v, finite) and v >= _value(low, p),
                lambda p: _noted(f"must be {kind}>= {_shown(low, p)}", note))


def above(low: float, *, finite: bool = False, note: str = "") -> Rule:
    """``value > low``; ``finite``: and finite."""
    kind = "a finite number " if finite else ""
    return Rule(lambda v, p: _number(v, finite) and v > low, _noted(f"must be {kind}> {low}", note))


def within(low: float, high: float, *, low_open: bool = False, note: str = "") -> Rule:
    """``low <= value <= high`` (``low < value`` with ``low_open``); NaN is outside."""
    return Rule(lambda v, p: _number(v, True) and (v > low if low_open else v >= low) and v <= high,
                _noted(f"must be in {'(' if low_open else '['}{low}, {high}]", note))


def at_least_or_auto(low: Bound) -> Rule:
    """``"auto"``, or ``value >= low`` (``low``: a number or another param's name; a bound param
    set to ``"auto"`` bounds nothing here, just ``>= 1``)."""
    def bound(p: Params) -> Any:
        value = _value(low, p)
        return 1 if value == "auto" else value

    return Rule(lambda v, p: v == "auto" or (_number(v, True) and v >= bound(p)),
                lambda p: f"must be 'auto' or >= {_shown(low, p)}")


def vector_or_json(value: Any) -> Any:
    """A vector param's type converter that also reads MLlib's JSON form of a vector (what a saved
    estimator's metadata holds)."""
    from pyspark.ml.linalg import Vectors

    if isinstance(value, dict) and "values" in value:
        return Vectors.sparse(value["size"], value["indices"], value["values"]) if value.get("type") == 0 \
            else Vectors.dense(value["values"])
    return TypeConverters.toVector(value)


def matrix_or_json(value: Any) -> Any:
    """A matrix param's type converter that also reads MLlib's JSON form of a matrix."""
    from pyspark.ml.linalg import DenseMatrix, SparseMatrix

    if isinstance(value, dict) and "values" in value:
        if value.get("type") == 0:
            return SparseMatrix(value["numRows"], value["numCols"], value["colPtrs"], value["rowIndices"],
                                value["values"], value.get("isTransposed", False))
        return DenseMatrix(value["numRows"], value["numCols"], value["values"], value.get("isTransposed", False))
    return TypeConverters.toMatrix(value)


def int_or_auto(value: Any) -> Any:
    """Type converter of a param that takes an int or ``"auto"``."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return TypeConverters.toInt(value)


def one_of(*choices: Any, note: str = "") -> Rule:
    return Rule(lambda v, p: v in choices, _noted("is not one of " + ", ".join(map(repr, choices)), note))


#: the MLlib params every pystrads estimator means the same by (applied where a class has them)
COMMON_RULES: Dict[str, Rule] = {
    "maxIter": at_least(0, note="0 returns the initial model, as MLlib"),
    "numWorkers": at_least(0, note="0 = one worker per executor, with its cores"),
    "checkpointInterval": Rule(lambda v, p: v == -1 or v >= 1,
                               "must be >= 1, or -1 to disable checkpoints (MLlib's rule)"),
    "regParam": at_least(0, finite=True),
    "tol": above(0, finite=True),
    "stepSize": above(0, finite=True),
}


# ----------------------------------------------------------------------------- input columns
@dataclasses.dataclass(frozen=True)
class ColumnKind:
    """What an input column holds: ``accepts(dataType)``, and ``expected`` (the message's
    description with the fix; ``{col}`` stands for the column's name)."""

    accepts: Callable[[Any], bool]
    expected: str

    def check(self, dataset, param: str, col: str) -> None:
        expected = self.expected.format(col=repr(col))
        if col not in dataset.columns:
            raise InputError(f"{param} {col!r} is not a column of the input (columns: {dataset.columns}); set "
                             f"{param} to the right column: {expected}")
        dtype = dataset.schema[col].dataType
        if not self.accepts(dtype):
            raise InputError(f"{param} {col!r} has type {dtype.simpleString()}; expected {expected}")


def _numeric(dtype) -> bool:
    from pyspark.sql.types import NumericType

    return isinstance(dtype, NumericType)


def vector_column(expected: str) -> ColumnKind:
    from pyspark.ml.linalg import VectorUDT

    return ColumnKind(lambda dtype: isinstance(dtype, VectorUDT), expected)


def numeric_column(expected: str) -> ColumnKind:
    return ColumnKind(_numeric, expected)


NUMBERS = numeric_column("a numeric column (cast it, e.g. F.col({col}).cast('double'), or index strings with "
                         "StringIndexer)")
VECTORS = vector_column("a vector column (pyspark.ml.linalg, e.g. from VectorAssembler)")


# ----------------------------------------------------------------------------- the base
class _StradsParams(Params):
    """Base of the pystrads Params mixins (see the module docstring)."""

    #: param name -> Rule (or a list of Rules, checked in order), declared by each mixin and merged
    #: along the MRO (a subclass's entry replaces its base's)
    _param_rules: Dict[str, Union[Rule, List[Rule]]] = {}
    #: input-column param name -> ColumnKind, declared likewise
    _column_kinds: Dict[str, ColumnKind] = {}
    #: MLlib param name -> MLlibOnly: the MLlib params taken but not honoured, declared likewise
    _mllib_only: Dict[str, MLlibOnly] = {}

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        for name, value in list(vars(cls).items()):
            if isinstance(value, Param):
                add_accessor(cls, "get", name)

    @classmethod
    def _merged(cls, attribute: str, base: Dict[str, Any]) -> Dict[str, Any]:
        merged = dict(base)
        for klass in reversed(cls.__mro__):
            merged.update(vars(klass).get(attribute, {}))
        return merged

    def _check_params(self) -> None:
        """Every declared rule of a param that is defined, before any Spark job; raises
        :class:`~pystrads.errors.ConfigurationError`.  Mixins add the rules that tie several
        params together by overriding this (calling ``super()`` first)."""
        for name, rule in self._merged("_param_rules", COMMON_RULES).items():
            if self.hasParam(name) and self.isDefined(name):
                for one in rule if isinstance(rule, list) else [rule]:
                    one.check(self, name)
        for name, gap in self._merged("_mllib_only", {}).items():
            if gap.refused and gap.applies(self, name):
                raise ConfigurationError(f"{name}={self.getOrDefault(name)!r} is not supported: {gap.instead}")

    def _check_set_params(self) -> None:
        """The checks MLlib makes as params are set (constructor, ``setParams``) rather than at
        fit: none by default."""

    def _warn_mllib_only(self) -> None:
        """Log a warning for each MLlib param set that this class takes but ignores."""
        for name, gap in self._merged("_mllib_only", {}).items():
            if not gap.refused and gap.applies(self, name):
                logging.getLogger(type(self).__module__).warning(
                    "%s: %s=%r is ignored with %s", type(self).__name__, name, self.getOrDefault(name), gap.instead)

    def _warn_ignored(self, mode: str, *params: str) -> None:
        """Log a warning for each of ``params`` the user set (to a non-zero value) that ``mode``
        (e.g. "algorithm='sgd'") ignores: the fit goes on, the user learns why it had no effect."""
        for name in params:
            if self.isSet(name) and self.getOrDefault(name):
                logging.getLogger(type(self).__module__).warning(
                    "%s: %s=%r is ignored with %s", type(self).__name__, name, self.getOrDefault(name), mode)

    def _check_columns(self, dataset, *params: str) -> None:
        """The input columns the ``params`` name exist and have the declared kind (no Spark
        job); a param that is unset or empty (``weightCol=""``) names no column."""
        from ..spark import is_dataframe

        if not is_dataframe(dataset):  # MLlib's TypeError, before anything reads it
            raise TypeError(f"dataset must be a DataFrame but got {type(dataset)}.")
        kinds = self._merged("_column_kinds", {})
        for param in params:
            col = self.getOrDefault(param) if self.isDefined(param) else None
            if col:
                kinds[param].check(dataset, param, col)


class HasNumWorkers(_StradsParams):
    """Mixin for param numWorkers: the data partitions (workers) of a fit."""

    numWorkers: "Param[int]" = Param(
        Params._dummy(), "numWorkers",
        "data partitions (workers) updating the model in parallel; they must all run at once (barrier "
        "mode). 0 = one worker per executor computing with that executor's cores (in local mode one "
        "worker with the local cores).", typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(numWorkers=0)


def _boolean(dtype) -> bool:
    from pyspark.sql.types import BooleanType

    return isinstance(dtype, BooleanType)


class HasEarlyStopping(_StradsParams):
    """Mixin for the params of early stopping on a validation set: ``validationIndicatorCol``
    (MLlib's GBTs, xgboost.spark), ``validationTol`` (MLlib's GBTs) and ``earlyStoppingRounds``
    (xgboost's); see :class:`~pystrads.engine.program.stopping.EarlyStopping` for the rule."""

    validationIndicatorCol: "Param[str]" = Param(
        Params._dummy(), "validationIndicatorCol",
        "name of the boolean column that indicates whether each row is for training or for validation. False "
        "(or null) indicates training; true indicates validation: those rows are never trained on, and their "
        "metric is computed after every iteration (recorded in the training summary) for early stopping. "
        "Empty (the default): no validation set.",
        typeConverter=TypeConverters.toString)
    validationTol: "Param[float]" = Param(
        Params._dummy(), "validationTol",
        "relative improvement of the validation metric that counts as one (>= 0): an iteration improves when "
        "its metric is below best - validationTol * max(|metric|, 0.01); 0 counts any decrease. Ignored "
        "without validationIndicatorCol.", typeConverter=TypeConverters.toFloat)
    earlyStoppingRounds: "Param[int]" = Param(
        Params._dummy(), "earlyStoppingRounds",
        "stop once the validation metric has not improved for this many iterations (>= 0; 0 = never stop, "
        "only record the metric). Ignored without validationIndicatorCol.", typeConverter=TypeConverters.toInt)

    _param_rules = {"validationTol": at_least(0, finite=True),
                    "earlyStoppingRounds": at_least(0, note="0 = record the validation metric, never stop")}
    _column_kinds = {"validationIndicatorCol": ColumnKind(
        _boolean, "a boolean column (true = validation row), e.g. F.col({col}).cast('boolean') or "
                  "F.rand(seed) < 0.1")}

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(validationIndicatorCol="", validationTol=0.0, earlyStoppingRounds=2)

    def _validation_col(self):
        """The validation indicator column, or None when the fit has no validation set."""
        return self.getOrDefault("validationIndicatorCol") or None

    def _early_stopping(self, metric: str):
        """The stop rule of a fit with a validation set (None without one)."""
        from ..engine.program.stopping import EarlyStopping

        if self._validation_col() is None:
            return None
        return EarlyStopping(metric, self.getOrDefault("earlyStoppingRounds"), self.getOrDefault("validationTol"),
                             source=f"validationIndicatorCol {self._validation_col()!r}")
