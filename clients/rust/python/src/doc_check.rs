//! `DocPlan`: the payload check's compiled, one-sided fast path (issue 29), a binding over
//! prism-client's `json_fit`. `app/schema/payload_check.py` builds one per protobuf schema from
//! the plan its Python fast path walks (`_flat_plan` of `_json_plan`) and asks `fits(payload)`
//! before decoding a JSON payload: `True` means `json_format.Parse` certainly accepts it (no
//! violation), `False` that the Python path decides, exactly as without this module.

use std::panic::{catch_unwind, AssertUnwindSafe};

use prism_client::json_fit::{Field, Kind, Message, Plan};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::with_bytes;

/// A field of the flattened plan, as `payload_check._flat_plan` gives it: (JSON keys, kind,
/// lo, hi, repeated, message index). Kinds are payload_check's `_STR, _INT, _NUM, _BOOL,
/// _MSG` (0..4); lo and hi are ints for `_INT` and floats for `_NUM`, unused otherwise; the
/// message index is given for `_MSG` only.
type FlatField<'py> = (
    Vec<String>,
    u8,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    bool,
    Option<usize>,
);

fn field(
    kind: u8,
    lo: &Bound<'_, PyAny>,
    hi: &Bound<'_, PyAny>,
    repeated: bool,
    sub: Option<usize>,
) -> PyResult<Field> {
    let kind = match kind {
        0 => Kind::Str,
        1 => Kind::Int {
            lo: lo.extract()?,
            hi: hi.extract()?,
        },
        2 => Kind::Num {
            lo: lo.extract()?,
            hi: hi.extract()?,
        },
        3 => Kind::Bool,
        4 => Kind::Msg(sub.ok_or_else(|| PyValueError::new_err("a message field without its message"))?),
        other => return Err(PyValueError::new_err(format!("unknown field kind {other}"))),
    };
    Ok(Field { kind, repeated })
}

/// The compiled plan of one protobuf message's JSON form.
#[pyclass(frozen, module = "prism_native")]
pub struct DocPlan {
    plan: Plan,
}

#[pymethods]
impl DocPlan {
    /// `messages`: the flattened plan (the first message is the document's); `max_depth`: the
    /// nesting of messages followed at most (the document is depth 1).
    #[new]
    fn new(messages: Vec<Vec<FlatField<'_>>>, max_depth: usize) -> PyResult<Self> {
        let mut built = Vec::with_capacity(messages.len());
        for fields in messages {
            let mut flat = Vec::with_capacity(fields.len());
            for (keys, kind, lo, hi, repeated, sub) in fields {
                flat.push((keys, field(kind, &lo, &hi, repeated, sub)?));
            }
            built.push(Message::new(flat));
        }
        let plan = Plan::new(built, max_depth).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(DocPlan { plan })
    }

    /// True only when `payload` is certainly a JSON document `json_format.Parse` accepts for
    /// the message; False for anything else or not certain (a panic, which there should never
    /// be, is a False too: the Python path then decides).
    fn fits(&self, payload: &Bound<'_, PyAny>) -> PyResult<bool> {
        with_bytes(payload, |buf| {
            Ok(catch_unwind(AssertUnwindSafe(|| self.plan.fits(buf))).unwrap_or(false))
        })
    }
}
