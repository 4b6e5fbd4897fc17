//! One script run inside QuickJS: a fresh runtime and context per call, limits set
//! before any user code runs, and the result brought back as JSON.
//!
//! Everything here is blocking and must run off the async runtime's worker threads
//! (see [`super::ScriptRunner`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rquickjs::context::intrinsic;
use rquickjs::{Context, Ctx, Function, Runtime, Value};

use super::memory::CappedAllocator;
use super::{ScriptError, ScriptLimits};

/// The intrinsics a script gets: the ECMAScript language and nothing of the host.
/// QuickJS itself offers no file, network, process or timer API (those live in
/// quickjs-libc, which is not linked); `Performance` is left out so scripts get no
/// high-resolution clock, and no module loader is installed. `Eval` is needed to
/// compile the script at all. `Atomics.wait`, the one blocking call, is refused
/// because the runtime is never marked as allowed to block.
type Intrinsics = (
    intrinsic::Date,
    intrinsic::Eval,
    intrinsic::RegExpCompiler,
    intrinsic::RegExp,
    intrinsic::Json,
    intrinsic::Proxy,
    intrinsic::MapSet,
    intrinsic::TypedArrays,
    intrinsic::Promise,
    intrinsic::WeakRef,
);

/// Longest description of a thrown value that goes into an error message.
const MAX_MESSAGE_CHARS: usize = 2000;

/// Most elements an array method may walk in one call.
const MAX_ARRAY_WALK: u64 = 1 << 24;

/// Run before the script, in its context: every `Array.prototype` method that
/// walks its array refuses one longer than [`MAX_ARRAY_WALK`], and so do the
/// natives that walk an array-like an argument brings: `concat`'s spreadable
/// arguments, the arrays `flat` and `flatMap` flatten, `JSON.stringify`'s
/// replacer list, `String.raw`'s `raw`, and `Iterator.prototype.drop`'s count.
///
/// QuickJS polls the interrupt handler only while it runs bytecode. A native
/// method walking a huge sparse array (`Array(2e9).join("")`, or `forEach`,
/// which skips the holes without calling back) runs in C for half a minute,
/// holding a sandbox slot every account shares, and costs no memory, so no
/// other limit stops it. The originals and `Reflect.apply` are kept in this
/// closure, out of the script's reach; the lazy iterators and `at` walk
/// nothing.
static ARRAY_GUARD: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| ARRAY_GUARD_SOURCE.replace("LIMIT", &MAX_ARRAY_WALK.to_string()));

/// [`ARRAY_GUARD`] before its limit is written in.
const ARRAY_GUARD_SOURCE: &str = r#"(() => {
  const limit = LIMIT;
  const apply = Reflect.apply;
  const toNumber = Number;
  const define = Object.defineProperty;
  const isArray = Array.isArray;
  const spreadable = Symbol.isConcatSpreadable;
  const refuse = (what, length) => {
    throw new RangeError(`${what} on ${length} elements: the sandbox walks at most ${limit}`);
  };
  const lengthOf = (value) => (value == null ? 0 : toNumber(value.length));
  const bounded = (what, value) => {
    const length = lengthOf(value);
    if (length > limit) refuse(what, length);
  };
  // Replaces `target[name]` by a function that runs `check(this, args)` first.
  const guard = (target, name, check) => {
    const original = target[name];
    if (typeof original !== "function") return;
    define(target, name, {
      value: function (...args) {
        check(this, args);
        return apply(original, this, args);
      },
      writable: true,
      enumerable: false,
      configurable: true,
    });
  };
  // What concat spreads, as it decides it.
  const spreads = (value) =>
    value !== null && (typeof value === "object" || typeof value === "function") &&
    (value[spreadable] !== undefined ? !!value[spreadable] : isArray(value));
  // The arrays flat would walk below `array`, to `depth` (a walk in script
  // code, which the interrupt stops).
  const nested = (array, depth) => {
    if (!(depth >= 1)) return;
    const length = lengthOf(array);
    for (let i = 0; i < length; i++) {
      const element = array[i];
      if (isArray(element)) {
        bounded("Array.prototype.flat", element);
        nested(element, depth - 1);
      }
    }
  };
  const proto = Array.prototype;
  const walkless = ["constructor", "at", "values", "keys", "entries"];
  // Beyond `this`: the arrays a method walks that its arguments bring.
  const extra = {
    concat: (args) => {
      for (const arg of args) if (spreads(arg)) bounded("Array.prototype.concat", arg);
    },
    flat: (args, self) => nested(self, args[0] === undefined ? 1 : toNumber(args[0])),
    flatMap: (args) => {
      const mapper = args[0];
      if (typeof mapper !== "function") return;
      args[0] = function (...inner) {
        const mapped = apply(mapper, this, inner);
        if (isArray(mapped)) bounded("Array.prototype.flatMap", mapped);
        return mapped;
      };
    },
  };
  for (const name of Object.getOwnPropertyNames(proto)) {
    if (walkless.includes(name)) continue;
    const more = extra[name];
    guard(proto, name, (self, args) => {
      bounded(`Array.prototype.${name}`, self);
      if (more) more(args, self);
    });
  }
  // Natives outside Array.prototype that walk an array-like of the script's.
  guard(JSON, "stringify", (_, args) => {
    if (isArray(args[1])) bounded("JSON.stringify's replacer", args[1]);
  });
  guard(String, "raw", (_, args) => {
    if (args[0] != null) bounded("String.raw", args[0].raw);
  });
  if (typeof Iterator === "function") {
    guard(Iterator.prototype, "drop", (_, args) => {
      const count = toNumber(args[0]);
      if (count > limit) refuse("Iterator.prototype.drop", count);
    });
  }
})();"#;

/// A failure inside the engine, before it is told apart from a limit hit.
enum Failure {
    /// A JavaScript exception; the text describes the thrown value.
    Thrown(String),
    /// The script's promise was rejected with this value.
    Rejected(String),
    /// Anything that is not an exception, already phrased for the caller.
    Other(ScriptError),
}

/// Runs `script` as the body of `function (args) { ... }` with `args`, and returns
/// what it returned (or what its promise resolved to) as JSON.
pub fn run(
    script: &str,
    args: &serde_json::Value,
    limits: &ScriptLimits,
) -> Result<serde_json::Value, ScriptError> {
    let started = Instant::now();
    let memory_hit = Arc::new(AtomicBool::new(false));
    let allocator = CappedAllocator::new(limits.memory_bytes, memory_hit.clone());
    let runtime =
        Runtime::new_with_alloc(allocator).map_err(|err| ScriptError::Engine(err.to_string()))?;
    runtime.set_max_stack_size(limits.stack_bytes);
    let deadline = started + limits.time;
    let expired = Arc::new(AtomicBool::new(false));
    {
        let expired = expired.clone();
        // QuickJS calls this every few thousand operations (and from the regex
        // engine); returning true raises an uncatchable error, so a script cannot
        // outlast its deadline by catching it.
        runtime.set_interrupt_handler(Some(Box::new(move || {
            if Instant::now() >= deadline {
                expired.store(true, Ordering::Relaxed);
                true
            } else {
                false
            }
        })));
    }
    let context = Context::custom::<Intrinsics>(&runtime)
        .map_err(|err| ScriptError::Engine(format!("could not create a script context: {err}")))?;
    let outcome = context.with(|ctx| evaluate(&ctx, script, args, limits, deadline));
    let timed_out = expired.load(Ordering::Relaxed) || Instant::now() >= deadline;
    // Drop the context before the runtime so every object is freed inside it.
    drop(context);
    drop(runtime);
    let out_of_memory = memory_hit.load(Ordering::Relaxed);
    match outcome {
        // Finished, but late: a native call ran past the deadline without
        // polling the interrupt. Its value is not worth more than the limit.
        Ok(_) if timed_out => Err(ScriptError::TimeLimit(limits.time)),
        Ok(value) => Ok(value),
        Err(_) if timed_out => Err(ScriptError::TimeLimit(limits.time)),
        Err(_) if out_of_memory => Err(ScriptError::MemoryLimit(limits.memory_bytes)),
        Err(Failure::Thrown(text)) if is_stack_overflow(&text) => {
            Err(ScriptError::StackLimit(limits.stack_bytes))
        }
        Err(Failure::Thrown(text)) => Err(ScriptError::Thrown(text)),
        Err(Failure::Rejected(text)) => Err(ScriptError::Rejected(text)),
        Err(Failure::Other(err)) => Err(err),
    }
}

fn is_stack_overflow(text: &str) -> bool {
    text.contains("Maximum call stack size exceeded") || text.contains("stack overflow")
}

fn evaluate(
    ctx: &Ctx<'_>,
    script: &str,
    args: &serde_json::Value,
    limits: &ScriptLimits,
    deadline: Instant,
) -> Result<serde_json::Value, Failure> {
    // The body goes between braces of a function expression, as `new Function`
    // would place it. A body that closes the brace early only gets to run code at
    // the top level of this same throwaway context, under the same limits.
    ctx.eval::<(), _>(ARRAY_GUARD.as_str())
        .map_err(|err| caught(ctx, err))?;
    let source = format!("(function (args) {{\n{script}\n}})");
    let mut options = rquickjs::context::EvalOptions::default();
    options.global = true;
    options.strict = false;
    options.filename = Some("tool-script".to_owned());
    let function: Value = ctx
        .eval_with_options(source, options)
        .map_err(|err| caught(ctx, err))?;
    let function: Function = function.into_function().ok_or_else(|| {
        Failure::Other(ScriptError::Invalid(
            "the script body does not form a function; check its braces".to_owned(),
        ))
    })?;
    let args = ctx
        .json_parse(args.to_string())
        .map_err(|err| caught(ctx, err))?;
    let returned: Value = function.call((args,)).map_err(|err| caught(ctx, err))?;
    let value = match returned.as_promise() {
        Some(promise) => settle(ctx, promise, deadline)?,
        None => returned,
    };
    to_json(ctx, value, limits)
}

/// Runs queued jobs until the promise settles, the queue is empty (it never will
/// settle) or the deadline passes.
fn settle<'js>(
    ctx: &Ctx<'js>,
    promise: &rquickjs::Promise<'js>,
    deadline: Instant,
) -> Result<Value<'js>, Failure> {
    loop {
        match promise.result::<Value>() {
            Some(Ok(value)) => return Ok(value),
            // A rejection arrives as a pending exception holding the reason.
            Some(Err(err)) => {
                return Err(match caught(ctx, err) {
                    Failure::Thrown(reason) => Failure::Rejected(reason),
                    other => other,
                });
            }
            None => {
                if Instant::now() >= deadline {
                    // Reported as the time limit by the caller.
                    return Err(Failure::Other(ScriptError::NeverSettled));
                }
                if !ctx.execute_pending_job() {
                    return Err(Failure::Other(ScriptError::NeverSettled));
                }
            }
        }
    }
}

/// Serialises the script's value as `JSON.stringify` would and parses it back.
fn to_json<'js>(
    ctx: &Ctx<'js>,
    value: Value<'js>,
    limits: &ScriptLimits,
) -> Result<serde_json::Value, Failure> {
    let kind = if value.is_function() {
        "a function"
    } else if value.is_symbol() {
        "a symbol"
    } else {
        value.type_name()
    };
    let text = match ctx.json_stringify(value) {
        Ok(Some(text)) => text,
        Ok(None) => {
            return Err(Failure::Other(ScriptError::NotSerializable(format!(
                "the script returned {kind}, which has no JSON form; return an object, array, string, number, boolean or null"
            ))));
        }
        Err(err) => {
            return Err(match caught(ctx, err) {
                Failure::Thrown(text) => Failure::Other(ScriptError::NotSerializable(format!(
                    "the script's return value cannot be converted to JSON: {text}"
                ))),
                other => other,
            });
        }
    };
    // The copy below is bounded: the engine's memory limit already bounds `text`.
    let text = text.to_string().map_err(|err| {
        Failure::Other(ScriptError::NotSerializable(format!(
            "the script's return value is not valid text: {err}"
        )))
    })?;
    if text.len() > limits.output_bytes {
        return Err(Failure::Other(ScriptError::OutputLimit {
            limit: limits.output_bytes,
            size: text.len(),
        }));
    }
    serde_json::from_str(&text).map_err(|err| {
        let problem = if err.to_string().contains("recursion limit") {
            "it is nested more than 128 levels deep".to_owned()
        } else {
            err.to_string()
        };
        Failure::Other(ScriptError::NotSerializable(format!(
            "the script's return value cannot be used as a tool result: {problem}"
        )))
    })
}

/// Turns an engine error into a failure, taking the pending exception if any.
fn caught(ctx: &Ctx<'_>, err: rquickjs::Error) -> Failure {
    match err {
        rquickjs::Error::Exception => Failure::Thrown(describe(ctx, ctx.catch())),
        rquickjs::Error::Allocation => Failure::Thrown("out of memory".to_owned()),
        other => Failure::Other(ScriptError::Engine(other.to_string())),
    }
}

/// A readable one-line description of a thrown value: `Name: message` for errors,
/// the JSON form (or `String(value)`) for anything else.
fn describe<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> String {
    let text = if let Some(exception) = value.as_exception() {
        let name: Option<String> = exception.as_object().get("name").ok();
        let message = exception.message().unwrap_or_default();
        match name {
            Some(name) if !name.is_empty() => format!("{name}: {message}"),
            _ => message,
        }
    } else if value.is_undefined() {
        "a non-Error value: undefined".to_owned()
    } else {
        let shown = ctx
            .json_stringify(value.clone())
            .ok()
            .flatten()
            .and_then(|s| s.to_string().ok())
            .or_else(|| {
                value
                    .as_string()
                    .and_then(|s| s.to_string().ok())
                    .or_else(|| Some(format!("({})", value.type_name())))
            })
            .unwrap_or_default();
        format!("a non-Error value: {shown}")
    };
    // Describing may itself have thrown (a hostile getter); leave nothing pending.
    if ctx.has_exception() {
        let _ = ctx.catch();
    }
    truncate(text)
}

fn truncate(mut text: String) -> String {
    if let Some((cut, _)) = text.char_indices().nth(MAX_MESSAGE_CHARS) {
        text.truncate(cut);
        text.push('…');
    }
    text
}
