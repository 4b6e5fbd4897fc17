//! `get_time`: the current date and time, in UTC or at a given UTC offset.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Builtin, Context, Provider, ToolError};
use crate::domain::tool::SideEffectLevel;

const OFFSET_PATTERN: &str = r"^[+-](0[0-9]|1[0-4]):[0-5][0-9]$";

/// Arguments of `get_time`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetTimeParams {
    /// UTC offset to express the time in, such as "+08:00" or "-05:30" (default: "+00:00")
    #[schemars(regex(pattern = OFFSET_PATTERN))]
    pub utc_offset: Option<String>,
}

/// Reads the server clock.
pub struct GetTime;

impl Builtin for GetTime {
    type Params = GetTimeParams;
    const NAME: &'static str = "get_time";
    const DESCRIPTION: &'static str = "Get the current date and time. Example: utc_offset=\"+08:00\" gives the time in China Standard Time.";
    const PROVIDER: Provider = Provider::ContextFree;
    const SIDE_EFFECT_LEVEL: SideEffectLevel = SideEffectLevel::None;

    async fn run(&self, _ctx: &Context<'_>, params: GetTimeParams) -> Result<Value, ToolError> {
        let offset = params.utc_offset.as_deref().unwrap_or("+00:00");
        let offset_minutes = parse_offset(offset).ok_or_else(|| {
            ToolError::new(format!(
                "utc_offset must look like \"+08:00\" or \"-05:30\", got {offset:?}"
            ))
        })?;
        Ok(describe(crate::ids::now_ms(), offset_minutes))
    }
}

/// Minutes east of UTC for `+HH:MM` / `-HH:MM`.
fn parse_offset(raw: &str) -> Option<i64> {
    let (sign, rest) = match raw.as_bytes().first()? {
        b'+' => (1, &raw[1..]),
        b'-' => (-1, &raw[1..]),
        _ => return None,
    };
    let (hours, minutes) = rest.split_once(':')?;
    if hours.len() != 2 || minutes.len() != 2 {
        return None;
    }
    let hours: i64 = hours.parse().ok()?;
    let minutes: i64 = minutes.parse().ok()?;
    (hours <= 14 && minutes < 60).then_some(sign * (hours * 60 + minutes))
}

fn describe(unix_ms: i64, offset_minutes: i64) -> Value {
    let local_ms = unix_ms + offset_minutes * 60_000;
    let days = local_ms.div_euclid(86_400_000);
    let ms_of_day = local_ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second, millis) = (
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1000 % 60,
        ms_of_day % 1000,
    );
    let offset = if offset_minutes == 0 {
        "Z".to_owned()
    } else {
        let sign = if offset_minutes < 0 { '-' } else { '+' };
        let abs = offset_minutes.abs();
        format!("{sign}{:02}:{:02}", abs / 60, abs % 60)
    };
    const WEEKDAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    json!({
        "iso8601": format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{millis:03}{offset}"),
        "date": format!("{year:04}-{month:02}-{day:02}"),
        "time": format!("{hour:02}:{minute:02}:{second:02}"),
        // 1970-01-01 was a Thursday.
        "weekday": WEEKDAYS[days.rem_euclid(7) as usize],
        "utc_offset": if offset == "Z" { "+00:00".to_owned() } else { offset },
        "unix_ms": unix_ms,
    })
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        // 2025-01-01T00:00:00Z, a Wednesday.
        let t = describe(1_735_689_600_000, 0);
        assert_eq!(t["iso8601"], "2025-01-01T00:00:00.000Z");
        assert_eq!(t["weekday"], "Wednesday");
        let t = describe(1_735_689_600_000, 8 * 60);
        assert_eq!(t["iso8601"], "2025-01-01T08:00:00.000+08:00");
        let t = describe(1_735_689_600_000, -(5 * 60 + 30));
        assert_eq!(t["iso8601"], "2024-12-31T18:30:00.000-05:30");
        assert_eq!(t["weekday"], "Tuesday");
        // A leap day.
        assert_eq!(describe(951_782_400_000, 0)["date"], "2000-02-29");
    }

    #[test]
    fn offsets_parse_strictly() {
        assert_eq!(parse_offset("+08:00"), Some(480));
        assert_eq!(parse_offset("-05:30"), Some(-330));
        for bad in ["08:00", "+8:00", "+15:00", "+08:60", "", "+", "+08:0a"] {
            assert_eq!(parse_offset(bad), None, "{bad}");
        }
        assert!(
            regex::Regex::new(OFFSET_PATTERN)
                .unwrap()
                .is_match("+14:00")
        );
    }
}
