//! The optional TOML configuration file of `picomq serve` (`--config FILE` or
//! `PICOMQ_CONFIG`). Its keys are the long flag names (`listen`, `long-poll-timeout`;
//! `_` works for `-`). A value from the file becomes the option's default, so clap's
//! own precedence gives flag > PICOMQ_* environment > file > built-in default, and
//! every value is checked by the same parser as its flag.

use std::path::Path;

use clap::{ArgMatches, Command};

/// The subcommand that reads a config file, and its flag naming the file.
const SERVE: &str = "serve";
const CONFIG_ARG: &str = "config";

/// Parses the command line; for `serve` with a config file, parses it again with the
/// file's values as defaults. Exits with a message (code 2) on any invalid input.
pub fn parse<P: clap::Parser>() -> P {
    let command = P::command();
    let matches = command.clone().get_matches();
    let file = matches
        .subcommand_matches(SERVE)
        .and_then(|m| m.get_one::<std::path::PathBuf>(CONFIG_ARG))
        .cloned();
    let Some(file) = file else {
        return from_matches::<P>(command, &matches);
    };
    let command = match apply_file(command, &file) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("picomq: config file {}: {e}", file.display());
            std::process::exit(2);
        }
    };
    let matches = command.clone().get_matches();
    from_matches::<P>(command, &matches)
}

fn from_matches<P: clap::Parser>(mut command: Command, matches: &ArgMatches) -> P {
    P::from_arg_matches(matches).unwrap_or_else(|e| e.format(&mut command).exit())
}

/// `command` with the `serve` options named in `file` defaulting to its values.
fn apply_file(command: Command, file: &Path) -> Result<Command, String> {
    let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    let settings = settings(&text)?;
    let serve = command
        .find_subcommand(SERVE)
        .expect("the serve subcommand exists")
        .clone();
    let mut command = command;
    for (key, value) in settings {
        let arg = serve
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()) && a.get_id() != CONFIG_ARG)
            .ok_or_else(|| format!("unknown option `{key}` (keys are `picomq serve` flag names without the leading --)"))?
            .clone();
        if arg.get_action().takes_values() {
            // The option's own parser judges the value, so the file gets the same
            // checks and messages as the flag.
            Command::new("picomq-serve-config")
                .no_binary_name(true)
                .arg(arg.clone().env(None::<&str>).default_value(None::<&str>))
                .try_get_matches_from([format!("--{key}"), value.clone()])
                .map_err(|e| format!("option `{key}`: {}", first_line(&e.to_string())))?;
        } else if value != "true" && value != "false" {
            return Err(format!("option `{key}` is a switch: use true or false"));
        }
        // Leaked once per option at start-up: clap wants a 'static default.
        let value: &'static str = Box::leak(value.into_boxed_str());
        let id = arg.get_id().clone();
        command = command.mut_subcommand(SERVE, |sc| sc.mut_arg(id, |a| a.default_value(value)));
    }
    Ok(command)
}

/// The file's `key = value` pairs as option names and command-line text.
fn settings(text: &str) -> Result<Vec<(String, String)>, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
    table
        .into_iter()
        .map(|(key, value)| {
            let key = key.replace('_', "-");
            let text = match value {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(format!(
                        "option `{key}` must be a string, number or boolean, not {}",
                        other.type_str()
                    ))
                }
            };
            Ok((key, text))
        })
        .collect()
}

fn first_line(s: &str) -> &str {
    let s = s.trim_start_matches("error: ");
    s.lines().next().unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_accept_scalars_and_normalize_keys() {
        let mut s =
            settings("listen = \"0.0.0.0:1\"\nmax_append_bytes = 10\nrate = 1.5\nflag = true\n")
                .unwrap();
        s.sort();
        assert_eq!(
            s,
            vec![
                ("flag".into(), "true".into()),
                ("listen".into(), "0.0.0.0:1".into()),
                ("max-append-bytes".into(), "10".into()),
                ("rate".into(), "1.5".into()),
            ]
        );
        assert!(settings("[table]\nx = 1\n")
            .unwrap_err()
            .contains("`table`"));
        assert!(settings("listen = \n").is_err());
    }
}
