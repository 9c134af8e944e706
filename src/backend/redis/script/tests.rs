//! The script call's Rust half against replies written by hand: what a call declares and
//! sends, and how each reply reads.

mod cases {
    use super::super::call::calendar_boundaries;
    use super::super::*;
    use crate::backend::BackendError;
    use crate::limiter::Decision;
    use crate::limiter::{Timezone, Unit};
    use redis::Value;

    /// The instant every test reply ran at.
    const NOW: i64 = 1_700_000_000_000_000;

    /// A reply of the script that ran and finished at [`NOW`]: the two instants, then
    /// `values`.
    fn reply(values: &[i64]) -> Value {
        Value::Array(
            [NOW, NOW]
                .into_iter()
                .chain(values.iter().copied())
                .map(Value::Int)
                .collect(),
        )
    }

    fn text(message: &str) -> Value {
        Value::BulkString(message.as_bytes().to_vec())
    }

    /// The arguments of `call` after EVALSHA and the SHA1, as text.
    fn arguments(call: &redis::Cmd) -> Vec<String> {
        call.args_iter()
            .skip(2)
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<cursor>".into(),
            })
            .collect()
    }

    #[test]
    fn a_code_and_a_reset_are_a_decision() {
        assert_eq!(
            decision(&reply(&[5, 250_000])),
            Ok(Decision {
                allowed: true,
                remaining: 4,
                reset_micros: 250_000
            })
        );
        assert_eq!(
            decision(&reply(&[-1, 7])),
            Ok(Decision {
                allowed: false,
                remaining: 0,
                reset_micros: 7
            })
        );
    }

    #[test]
    fn an_unexpected_reply_is_an_error_naming_what_is_wrong() {
        let cases = [
            (reply(&[1]), "ends before reset"),
            (reply(&[1, -1]), "reset = -1"),
            (reply(&[1, 1, 7]), "more than its calls"),
            (reply(&[0, 0]), "not a message"),
            (Value::Nil, "not an array"),
            (Value::Array(vec![]), "for its instant"),
            (
                Value::Array(vec![Value::Int(-1), Value::Int(1)]),
                "instant = -1",
            ),
            (Value::Array(vec![Value::Int(NOW)]), "for its end"),
            (
                Value::Array(vec![Value::Int(NOW), Value::Int(NOW), text("7")]),
                "code",
            ),
            (
                Value::Array(vec![Value::Int(NOW), text("late"), Value::Int(0)]),
                "after 'late'",
            ),
            (
                Value::Array(vec![Value::Int(NOW), text("late")]),
                "past its deadline",
            ),
        ];
        for (value, expected) in cases {
            let error = decision(&value).expect_err("not a decision").to_string();
            assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        }
    }

    #[test]
    fn a_failed_hit_gets_its_own_message_and_the_others_their_decisions() {
        let limit = Limit::per(5, Unit::Second);
        let hit = |key| RedisHit {
            binding: true,
            ..planned(key, &limit, Hits::take(1))
        };
        let each = [hit("a"), hit("b")];
        let all = [hit("c"), hit("d")];
        let groups = [
            Group {
                mode: Mode::Each,
                hits: &each,
            },
            Group {
                mode: Mode::AllOrNothing,
                hits: &all,
            },
        ];
        let mut items: Vec<Value> = [NOW, NOW, 5, 10, 0, 0, -1, 0, 0, 0, 0]
            .into_iter()
            .map(Value::Int)
            .collect();
        items.extend([text("WRONGTYPE b"), text("boom")]);
        let Ok(Answer::Decided { hits, applied, .. }) = read_reply(&Value::Array(items), &groups)
        else {
            panic!("a decided call");
        };
        assert_eq!(applied, [None]);
        let failed = |message: &str| Err(BackendError::Unavailable(format!("redis: {message}")));
        assert_eq!(
            hits,
            [
                Ok(Decision {
                    allowed: true,
                    remaining: 4,
                    reset_micros: 10
                }),
                failed("WRONGTYPE b"),
                failed("boom"),
                failed("boom"),
            ]
        );
    }

    fn planned(key: &str, limit: &Limit, hits: Hits) -> RedisHit {
        RedisHit {
            key: key.to_owned(),
            limit: limit.clone(),
            hits,
            binding: false,
        }
    }

    #[test]
    fn limits_are_sent_once_and_runs_of_one_limit_and_cost_share_a_header_short_ones_pooled() {
        let per_second = Limit::per(5, Unit::Second);
        let gcra = Limit {
            algorithm: Algorithm::Gcra,
            ..Limit::per(5, Unit::Second)
        };
        // An equal limit is sent once.
        let equal = per_second.clone();
        let first = [
            planned("a", &per_second, Hits::take(1)),
            planned("b", &gcra, Hits::give_back(3)),
        ];
        let second = [
            planned("c", &equal, Hits::take(1)),
            planned("d", &gcra, Hits::take(2)),
        ];
        let third = [planned("e", &gcra, Hits::take(1))];
        let groups = [
            Group {
                mode: Mode::Each,
                hits: &first,
            },
            Group {
                mode: Mode::Each,
                hits: &second,
            },
            Group {
                mode: Mode::AllOrNothing,
                hits: &third,
            },
        ];
        let call = batch_call(
            &Scripts::new(),
            &groups,
            Target::Server,
            ScriptClock::Redis,
            Some(42),
            0,
        );
        #[rustfmt::skip]
        let expected = [
            "0", "", "42", "2",
            "fixed_window", "5", "1000000", "5", "200000", "", "", "", "", "0",
            "gcra", "5", "1000000", "5", "200000", "", "", "", "", "0",
            "each", "2", "1", "1", "a", "c",
            "costs", "2", "2", "-3", "b", "2", "d",
            "all", "1", "e", "2", "1", "0",
        ];
        assert_eq!(arguments(&call), expected);
        // The reply comes in the order sent; each hit gets its own answer back.
        let sent_order = [5, 7, 9, 11];
        let mut items: Vec<Value> = [Value::Int(NOW), Value::Int(NOW)]
            .into_iter()
            .chain(
                sent_order
                    .iter()
                    .flat_map(|&code| [Value::Int(code), Value::Int(0)]),
            )
            .collect();
        items.extend([Value::Int(1), Value::Int(13), Value::Int(0)]);
        let Ok(Answer::Decided { hits, .. }) = read_reply(&Value::Array(items), &groups) else {
            panic!("a decided call");
        };
        let remaining: Vec<u64> = hits
            .iter()
            .map(|d| d.as_ref().expect("a decision").remaining)
            .collect();
        // a, b, c, d, e in call order: a=4, c=6 (the first run), b=8, d=10, e=12.
        assert_eq!(remaining, [4, 8, 6, 10, 12]);
    }

    #[test]
    fn a_call_past_its_deadline_answers_late_with_its_instant_and_no_decision() {
        let limit = Limit::per(5, Unit::Second);
        let hits = [planned("a", &limit, Hits::take(1))];
        let groups = [Group {
            mode: Mode::Each,
            hits: &hits,
        }];
        let late = Value::Array(vec![Value::Int(NOW), text("late")]);
        assert_eq!(
            read_reply(&late, &groups),
            Ok(Answer::Late { ran_at: NOW as u64 })
        );
        let decided = read_reply(&reply(&[5, 10]), &groups).expect("an answer");
        let at = NOW as u64;
        assert!(
            matches!(decided, Answer::Decided { ran, .. } if ran == RanAt { started: at, finished: at }),
            "{decided:?}"
        );
        // Without a deadline the call goes out with an empty one.
        let call = batch_call(
            &Scripts::new(),
            &groups,
            Target::Server,
            ScriptClock::Fixed(7),
            None,
            0,
        );
        assert_eq!(arguments(&call)[..4], ["0", "7", "", "1"]);
    }

    #[test]
    fn a_hit_that_failed_is_unavailable_with_its_message_and_a_bad_reply_a_protocol_error() {
        let failed = Value::Array(vec![
            Value::Int(1_700_000_000_000_000),
            Value::Int(1_700_000_000_000_000),
            Value::Int(0),
            Value::Int(0),
            Value::BulkString(b"Script attempted to access a non local key".to_vec()),
        ]);
        assert!(matches!(
            decision(&failed),
            Err(BackendError::Unavailable(message)) if message.contains("non local key")
        ));
        let decided = Value::Array(vec![
            Value::Int(1_700_000_000_000_000),
            Value::Int(1_700_000_000_000_000),
            Value::Int(5),
            Value::Int(10),
        ]);
        assert_eq!(
            decision(&decided),
            Ok(Decision {
                allowed: true,
                remaining: 4,
                reset_micros: 10
            })
        );
        assert!(matches!(
            decision(&Value::Nil),
            Err(BackendError::Protocol(_))
        ));
    }

    #[test]
    fn calendar_boundaries_are_the_previous_current_and_next_windows() {
        let paris = Timezone::parse("Europe/Paris").expect("Europe/Paris is in every tz database");
        let limit = Limit {
            timezone: Some(paris),
            ..Limit::per(1, Unit::Day)
        };
        let midnight = 1_711_839_600_000_000; // 2024-03-31T00:00+01:00, a 23-hour day
        let hour = 3_600_000_000;
        assert_eq!(
            calendar_boundaries(&limit, midnight + hour),
            Some([
                midnight - 24 * hour,
                midnight,
                midnight + 23 * hour,
                midnight + 47 * hour
            ])
        );
        assert_eq!(calendar_boundaries(&Limit::per(1, Unit::Day), 0), None);
    }
}

mod declared {
    use super::super::*;
    use crate::limiter::Unit;

    #[test]
    fn a_call_routed_by_slot_declares_every_key_a_sliding_log_has_two() {
        let log = Limit {
            algorithm: Algorithm::SlidingLog,
            ..Limit::per(5, Unit::Second)
        };
        let mut pipe = redis::pipe();
        let hit = RedisHit {
            key: "{t}:k".into(),
            limit: log,
            hits: Hits::take(1),
            binding: true,
        };
        add_call(
            &mut pipe,
            &Scripts::new(),
            &hit,
            ScriptClock::Redis,
            None,
            0,
        );
        let command = pipe.cmd_iter().next().expect("one command");
        let declared: Vec<Vec<u8>> = command
            .args_iter()
            .skip(2)
            .take(3)
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(declared, [&b"2"[..], b"{t}:k:log", b"{t}:k:n"]);
    }
}
