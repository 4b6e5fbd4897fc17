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

use super::memory::{CappedAllocator, Deadline};
use super::{ScriptError, ScriptLimits};

/// The intrinsics a script gets: the ECMAScript language and nothing of the host.
/// QuickJS itself offers no file, network, process or timer API (those live in
/// quickjs-libc, which is not linked); `Performance` is left out so scripts get no
/// high-resolution clock, and no module loader is installed. `Eval` is needed to
/// compile the script at all. `Atomics.wait`, the one blocking call, is refused
/// because the runtime is never marked as allowed to block. `Proxy` is left out:
/// its traps could answer the array guard one length and a native another.
type Intrinsics = (
    intrinsic::Date,
    intrinsic::Eval,
    intrinsic::RegExpCompiler,
    intrinsic::RegExp,
    intrinsic::Json,
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
/// natives that walk an array-like an argument brings: `concat`, `flat`,
/// `flatMap` and `String.raw` are written in script code over lengths read
/// once (so the interrupt stops them, and no getter can answer the check one
/// length and the walk another), `JSON.stringify`'s replacer list is checked,
/// and `Iterator.prototype.drop` gets its count converted once. A guarded
/// native refuses an array-like `this` whose `length` is a getter.
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
  const describe = Object.getOwnPropertyDescriptor;
  const prototypeOf = Object.getPrototypeOf;
  const isArray = Array.isArray;
  const spreadable = Symbol.isConcatSpreadable;
  const trunc = Math.trunc;
  const refuse = (what, length) => {
    throw new RangeError(`${what} on ${length} elements: the sandbox walks at most ${limit}`);
  };
  const toLength = (value) => {
    const n = trunc(toNumber(value));
    return n > 0 ? n : 0;
  };
  // Reads `value.length` once and refuses a walk past the limit; the caller
  // walks by the number it answered, so no getter can answer another later.
  const lengthOnce = (what, value) => {
    const length = toLength(value.length);
    if (length > limit) refuse(what, length);
    return length;
  };
  // For a native that reads `length` again: an array-like's length getter
  // could answer the guard and the native differently, so such a `this` is
  // refused (an Array's length is data, and scripts get no Proxy).
  const stableLength = (what, value) => {
    if (value == null) return;
    if (!isArray(value)) {
      for (let o = Object(value); o !== null; o = prototypeOf(o)) {
        const found = describe(o, "length");
        if (!found) continue;
        if (found.get || found.set) {
          throw new RangeError(`${what} on an array-like whose length is a getter: the sandbox does not walk it`);
        }
        break;
      }
    }
    lengthOnce(what, value);
  };
  const replace = (target, name, value) =>
    define(target, name, { value, writable: true, enumerable: false, configurable: true });
  const proto = Array.prototype;

  // The natives that walk what their arguments bring, written here so that
  // every walk is script code (the interrupt stops it) over lengths read once.
  const flatten = (what, out, source, length, depth, mapper, thisArg) => {
    for (let i = 0; i < length; i++) {
      if (!(i in source)) continue;
      let element = source[i];
      if (mapper) element = apply(mapper, thisArg, [element, i, source]);
      if (depth > 0 && isArray(element)) {
        flatten(what, out, element, lengthOnce(what, element), depth - 1);
      } else {
        if (out.length >= limit) refuse(what, out.length + 1);
        out[out.length] = element;
      }
    }
    return out;
  };
  replace(proto, "concat", function concat(...items) {
    const out = [];
    let n = 0;
    const sources = [Object(this), ...items];
    for (let s = 0; s < sources.length; s++) {
      const item = sources[s];
      const object = item !== null && (typeof item === "object" || typeof item === "function");
      const flag = object ? item[spreadable] : undefined;
      if (object && (flag !== undefined ? !!flag : isArray(item))) {
        const length = lengthOnce("Array.prototype.concat", item);
        if (n + length > limit) refuse("Array.prototype.concat", n + length);
        for (let k = 0; k < length; k++, n++) {
          if (k in item) out[n] = item[k];
        }
      } else {
        if (n >= limit) refuse("Array.prototype.concat", n + 1);
        out[n++] = item;
      }
    }
    out.length = n;
    return out;
  });
  replace(proto, "flat", function flat(depth) {
    const source = Object(this);
    const length = lengthOnce("Array.prototype.flat", source);
    const d = depth === undefined ? 1 : toNumber(depth);
    return flatten("Array.prototype.flat", [], source, length, d === d ? trunc(d) : 0);
  });
  replace(proto, "flatMap", function flatMap(mapper, thisArg) {
    const source = Object(this);
    const length = lengthOnce("Array.prototype.flatMap", source);
    if (typeof mapper !== "function") throw new TypeError("flatMap: the mapper is not a function");
    return flatten("Array.prototype.flatMap", [], source, length, 1, mapper, thisArg);
  });
  replace(String, "raw", function raw(template, ...substitutions) {
    const strings = Object(Object(template).raw);
    const length = lengthOnce("String.raw", strings);
    let out = "";
    for (let i = 0; i < length; i++) {
      out += String(strings[i]);
      if (i + 1 < length && i < substitutions.length) out += String(substitutions[i]);
    }
    return out;
  });

  // Replaces `target[name]` by a function that runs `check(this, args)` first
  // (it may put values it read in place of the arguments).
  const guard = (target, name, check) => {
    const original = target[name];
    if (typeof original !== "function") return;
    replace(target, name, function (...args) {
      check(this, args);
      return apply(original, this, args);
    });
  };
  // These walk nothing (or are written above): a sparse array longer than
  // the limit may still be pushed to, popped or read.
  const walkless = ["constructor", "at", "values", "keys", "entries", "push", "pop", "concat", "flat", "flatMap"];
  for (const name of Object.getOwnPropertyNames(proto)) {
    if (walkless.includes(name)) continue;
    guard(proto, name, (self) => stableLength(`Array.prototype.${name}`, self));
  }
  guard(JSON, "stringify", (_, args) => {
    if (isArray(args[1])) lengthOnce("JSON.stringify's replacer", args[1]);
  });
  if (typeof Iterator === "function") {
    guard(Iterator.prototype, "drop", (_, args) => {
      // Converted here, once: the native gets the number, not the object.
      const count = toNumber(args[0]);
      if (count > limit) refuse("Iterator.prototype.drop", count);
      args[0] = count;
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
    let deadline = started + limits.time;
    let expired = Arc::new(AtomicBool::new(false));
    let allocator = CappedAllocator::new(
        limits.memory_bytes,
        memory_hit.clone(),
        Deadline {
            at: deadline,
            expired: expired.clone(),
        },
    );
    let runtime =
        Runtime::new_with_alloc(allocator).map_err(|err| ScriptError::Engine(err.to_string()))?;
    runtime.set_max_stack_size(limits.stack_bytes);
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
