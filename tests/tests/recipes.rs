//! Recipes: validation and its messages, `extends`, `--set`, the schema, and the resolved recipe.

use std::path::{Path, PathBuf};

use runner::plan::{self, Machine};
use runner::recipe::{self, schema};

use crate::common::{
    any_machine, check, expect, expect_exit, root, runner_cmd, tempdir, tiny_recipe, with_sets,
};

/// Recipe files under `dir`, recursively, in name order.
fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "toml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Relative to the crate root, as a user in the checkout would type it.
fn rel(p: &Path) -> PathBuf {
    p.strip_prefix(root()).unwrap_or(p).to_path_buf()
}

// ---------------------------------------------------------------- recipes and errors

#[test]
fn every_shipped_recipe_validates() {
    std::env::set_current_dir(root()).unwrap();
    let files = toml_files(&root().join("recipes"));
    assert!(files.len() >= 7, "recipes/ walk found only {files:?}");
    assert!(
        files
            .iter()
            .any(|f| f.starts_with(root().join("recipes/article"))),
        "no recursion"
    );
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(
            text.starts_with("# "),
            "{} must open with a comment saying what it measures",
            f.display()
        );
        if let Err(r) = check(&rel(&f), &any_machine()) {
            panic!("{} does not validate:\n{r}", f.display());
        }
    }
}

#[test]
fn bad_recipes_give_their_expected_errors() {
    std::env::set_current_dir(root()).unwrap();
    let files = toml_files(&root().join("tests/fixtures/invalid"));
    assert!(
        files.len() >= 60,
        "only {} bad-recipe fixtures",
        files.len()
    );
    for f in files {
        let report = match check(&rel(&f), &Machine::cpu_only()) {
            Ok(_) => panic!("{} validated but must not", f.display()),
            Err(r) => r,
        };
        assert!(report.has_errors());
        for e in report.errors() {
            let placed = e.line.is_some() || e.message.contains("cannot read");
            assert!(
                placed || e.key.is_some(),
                "{}: finding without a place: {e}",
                f.display()
            );
        }
        expect(&f.with_extension("expected"), &format!("{report}\n"));
    }
}

/// A pre-flight finding's figures depend on the machine (its memory; device or host
/// memory): keep the finding, cut the figures.
fn without_limit(text: &str) -> String {
    text.lines()
        .map(|l| match l.find(" the run needs at least ") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The error findings of a report's text, and its closing count, without its warnings.
fn errors_only(text: &str) -> Vec<String> {
    let text = text.trim_end();
    let (body, last) = text.rsplit_once('\n').unwrap_or(("", text));
    let mut out: Vec<String> = body
        .split("\n\n")
        .filter(|b| b.starts_with("error"))
        .map(str::to_string)
        .collect();
    out.push(last.to_string());
    out
}

/// What users meet: every fixture through the binary, `runner FILE` (checked against this
/// machine) and `runner validate FILE` (against any machine, so a CUDA recipe is valid on a
/// laptop: the `cuda_*` fixtures are errors only for `run`). Exit 2, the expected text on
/// stderr, every finding at once, nothing written.
#[test]
fn bad_recipes_fail_through_the_binary_with_every_finding() {
    let logs = tempdir("fixtures-cli");
    for f in toml_files(&root().join("tests/fixtures/invalid")) {
        let file = rel(&f);
        // A binary built with the backend it names runs that recipe.
        let stem = f.file_stem().unwrap().to_string_lossy();
        if (cfg!(feature = "wgpu") && stem.starts_with("wgpu_"))
            || (cfg!(feature = "cuda") && stem.starts_with("cuda_"))
        {
            continue;
        }
        let want = std::fs::read_to_string(f.with_extension("expected")).unwrap();
        let run = runner_cmd().arg(&file).env("HOME", &logs).output().unwrap();
        expect_exit(&run, 2);
        // Errors met in a file it extends: the binary names the recipe that met them, after
        // the count (the .expected files are the library's report).
        let met = format!(", met by {} (it extends the file)", file.display());
        let elsewhere = want.lines().any(|l| {
            l.starts_with("error: ")
                && !l.starts_with(&format!("error: {}", file.display()))
                && l.contains(".toml:")
        });
        let raw = String::from_utf8_lossy(&run.stderr);
        assert_eq!(raw.contains(&met), elsewhere, "{raw}");
        let stderr = raw.replace(&met, "");
        assert_eq!(
            without_limit(stderr.trim_end()),
            without_limit(want.trim_end()),
            "`runner {}` printed other findings than its .expected",
            file.display()
        );
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(
            !root().join("runs").join(&name).exists(),
            "{name}: a bad recipe wrote a run directory"
        );
        let validate = runner_cmd().arg("validate").arg(&file).output().unwrap();
        // `validate` checks against any machine (a CUDA or WebGPU recipe is valid on a
        // laptop).
        if name.starts_with("cuda_") || name.starts_with("wgpu_") {
            continue;
        }
        expect_exit(&validate, 2);
        // Warnings may depend on the machine (a CPU-only warning under `run`): the errors
        // must be the same.
        assert_eq!(
            errors_only(&without_limit(
                &String::from_utf8_lossy(&validate.stderr).replace(&met, "")
            )),
            errors_only(&without_limit(&want)),
            "`runner validate {}` differs from `runner {}`",
            file.display(),
            file.display()
        );
    }
}

#[test]
fn warnings_do_not_stop_a_recipe() {
    let src = r#"
[model]
arch = "mlp"
[data]
format = "synthetic"
[loader]
pin_memory = true
[cleanup]
every = "step"
"#;
    let l = recipe::parse(Path::new("w.toml"), src.into()).unwrap();
    let p = plan::validate(&l, &Machine::cpu_only()).unwrap();
    let w: Vec<String> = p.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(w.len(), 2, "{w:#?}");
    assert!(
        w[0].contains("loader.pin_memory: does nothing on the CPU backend"),
        "{}",
        w[0]
    );
    assert!(
        w[1].contains("cleanup.actions: \"sync\" and \"empty_cache\" cost next to nothing"),
        "{}",
        w[1]
    );
}

#[test]
fn readme_documents_every_recipe_key() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for (table, fields) in schema::tables() {
        for f in fields {
            let key = if table.is_empty() {
                f.to_string()
            } else {
                format!("{table}.{f}")
            };
            // Sub-tables are documented by their own keys.
            if schema::tables().iter().any(|(t, _)| *t == key) {
                continue;
            }
            assert!(
                readme.contains(&format!("`{key}`")),
                "README.md does not document `{key}`"
            );
        }
    }
}

/// A run directory's `recipe.toml` (the resolved recipe) validates on its own and
/// resolves to itself, for every cell of every shipped recipe: it is what `runner eval`,
/// `runner resume` and a colleague's rerun read. (The text recipes' wrote the
/// `data.augment` and `padding.buckets` defaults that validation then refused, so no text
/// run could be resumed or evaluated.)
#[test]
fn the_resolved_recipe_runs_on_its_own() {
    std::env::set_current_dir(root()).unwrap();
    let dir = tempdir("resolved");
    let mut checked = 0;
    for f in toml_files(&root().join("recipes")) {
        let c = runner::sweep::check(&rel(&f), &[], &any_machine(), 256)
            .unwrap_or_else(|r| panic!("{}: {r}", f.display()));
        for (i, p) in c.plans.iter().enumerate() {
            let text = toml::to_string(&p.resolved).unwrap();
            let path = dir.join(format!("{checked}.toml"));
            std::fs::write(&path, &text).unwrap();
            let again = runner::sweep::check(&path, &[], &any_machine(), 1)
                .map(|mut c| c.plans.remove(0))
                .unwrap_or_else(|r| panic!("{} (cell {i}) resolved:\n{r}\n{text}", f.display()));
            assert_eq!(again.resolved, p.resolved, "{} (cell {i})", f.display());
            checked += 1;
        }
    }
    assert!(checked > 20, "{checked} resolved recipes");
    let quickstart = check(Path::new("recipes/quickstart.toml"), &Machine::cpu_only()).unwrap();
    let text = toml::to_string(&quickstart.resolved).unwrap();
    assert!(
        text.contains("weight_decay = 0.0005")
            && text.contains("num_classes = 10")
            && text.contains("[data.augment]"),
        "{text}"
    );
}

#[test]
fn extends_chains_merge_by_table_and_refuse_cycles() {
    let dir = tempdir("extends");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("a.toml"), "seed = 1\n[model]\narch = \"mlp\"\nhidden = [8]\n[data]\nformat = \"cifar10-bin\"\ntrain = \"data.bin\"\n[loader]\nbatch_size = 8\nworkers = 1\n").unwrap();
    std::fs::copy(
        root().join("datasets/cifar10_sample/test_batch.bin"),
        dir.join("data.bin"),
    )
    .unwrap();
    std::fs::write(
        dir.join("sub/b.toml"),
        "extends = \"../a.toml\"\nseed = 2\n[loader]\nbatch_size = 4\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("sub/c.toml"),
        "extends = \"b.toml\"\n[loader]\nworkers = \"x\"\n[optim]\nlr = 0.5\n",
    )
    .unwrap();
    let l = recipe::load(&dir.join("sub/c.toml")).unwrap();
    let r = &l.recipe;
    assert_eq!(
        (r.seed, r.loader.batch_size, r.optim.lr),
        (2, 4, 0.5),
        "each file's tables over its parent's, key by key"
    );
    let e = l.findings.to_string();
    assert!(
        e.contains("sub/c.toml:3:11: loader.workers: invalid type: string \"x\""),
        "{e}"
    );
    // A parent's relative data path is the parent's, and its keys point into the parent.
    let p = plan::validate(&l, &Machine::cpu_only()).unwrap_err();
    assert!(!p.to_string().contains("does not exist"), "{p}");
    let bad = recipe::load_with(&dir.join("sub/b.toml"), &["model.hidden=[0]".into()]).unwrap();
    let p = plan::validate(&bad, &Machine::cpu_only())
        .unwrap_err()
        .to_string();
    assert!(
        p.contains("--set: model.hidden: a hidden layer of size 0"),
        "{p}"
    );
    let ok = plan::validate(
        &recipe::load(&dir.join("sub/b.toml")).unwrap(),
        &Machine::cpu_only(),
    )
    .unwrap();
    assert_eq!(
        ok.resolved.data.train.as_deref(),
        Some(
            std::fs::canonicalize(dir.join("data.bin"))
                .unwrap()
                .to_str()
                .unwrap()
        )
    );
    let l = recipe::load(&dir.join("sub/b.toml")).unwrap();
    let w = l.error("model.arch", "x").to_string();
    assert!(w.contains("a.toml:3:8: model.arch"), "{w}");
    // Cycles.
    std::fs::write(dir.join("x.toml"), "extends = \"y.toml\"\n").unwrap();
    std::fs::write(dir.join("y.toml"), "extends = \"x.toml\"\n").unwrap();
    let e = recipe::load(&dir.join("x.toml")).unwrap_err().to_string();
    assert!(
        e.contains("extends forms a cycle: x.toml → y.toml → x.toml"),
        "{e}"
    );
    let e = recipe::load(&dir.join("sub/missing.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot read recipe"), "{e}");
    // In a folder that is a symbolic link, `..` leaves the link's target, as the OS opens
    // it (and the recipe's data paths): with a base file beside the link too, that one was
    // read, and one recipe file made two recipes.
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(elsewhere.join("shared")).unwrap();
    std::fs::write(
        elsewhere.join("a.toml"),
        format!(
            "extends = {:?}\nseed = 7\n",
            dir.join("a.toml").display().to_string()
        ),
    )
    .unwrap();
    std::fs::write(elsewhere.join("shared/e.toml"), "extends = \"../a.toml\"\n").unwrap();
    std::os::unix::fs::symlink(elsewhere.join("shared"), dir.join("linked")).unwrap();
    for path in [dir.join("linked/e.toml"), elsewhere.join("shared/e.toml")] {
        assert_eq!(
            recipe::load(&path).unwrap().recipe.seed,
            7,
            "{}",
            path.display()
        );
    }
    // `~/` is $HOME, and a base missing there is not said to be relative to the recipe.
    std::fs::write(
        dir.join("home.toml"),
        "extends = \"~/no-such-runner-base.toml\"\n",
    )
    .unwrap();
    let e = recipe::load(&dir.join("home.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("a leading ~ is $HOME"), "{e}");
}

#[test]
fn overrides_on_the_command_line_are_typed() {
    let out = runner_cmd()
        .args([
            "validate",
            "recipes/quickstart.toml",
            "--set",
            "loader.workers=four",
            "--set",
            "loader.wokers=2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error: --set: loader.workers: invalid type: string \"four\", expected a non-negative integer"), "{err}");
    assert!(
        err.contains("error: --set: loader.wokers: unknown key in [loader]"),
        "{err}"
    );
    let show = runner_cmd()
        .args([
            "show",
            "recipes/quickstart.toml",
            "--set",
            "loader.workers=2",
            "--set",
            "cleanup.every=\"step\"",
        ])
        .output()
        .unwrap();
    expect_exit(&show, 0);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.contains("workers = 2") && text.contains("every = \"step\""),
        "{text}"
    );
}

#[test]
fn the_schema_accepts_every_shipped_recipe_and_rejects_a_wrong_one() {
    let schema = runner::recipe::schema::json_schema();
    let shipped: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("recipe.schema.json")).unwrap())
            .unwrap();
    assert_eq!(
        shipped, schema,
        "recipe.schema.json is stale: cargo run --release -- schema -o recipe.schema.json"
    );
    let validator = jsonschema::validator_for(&schema).unwrap();
    let as_json = |path: &Path| -> serde_json::Value {
        let t: toml::Table = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        serde_json::to_value(t).unwrap()
    };
    for f in toml_files(&root().join("recipes"))
        .into_iter()
        .chain(toml_files(&root().join("tests/fixtures/sweep")))
    {
        let v = as_json(&f);
        let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", f.display());
    }
    for bad in [
        "unknown_key",
        "wrong_type",
        "unknown_arch",
        "cleanup_every_zero",
    ] {
        let v = as_json(&root().join(format!("tests/fixtures/invalid/{bad}.toml")));
        assert!(
            !validator.is_valid(&v),
            "the schema accepts tests/fixtures/invalid/{bad}.toml"
        );
    }
    // A grid's axes as the runner reads them: quoted, dotted, as tables, or mixed; a typo
    // in a swept key, and a key swept for the whole grid, as the runner refuses them (the
    // schema took any key, and refused the dotted and table forms).
    let grid = |sweep: &str| -> serde_json::Value {
        let t: toml::Table = toml::from_str(&format!(
            "[model]\narch = \"mlp\"\n[data]\nformat = \"synthetic\"\n{sweep}"
        ))
        .unwrap();
        serde_json::to_value(t).unwrap()
    };
    for ok in [
        "[sweep]\n\"loader.workers\" = [0, 2]\n",
        "[sweep]\nloader.workers = [0, 2]\n",
        "[sweep.loader]\nworkers = [0, 2]\n",
        "[sweep.data]\n\"normalize.on\" = [\"host\", \"device\"]\n",
        "[sweep]\ndata.normalize.on = [\"host\"]\nseed = [1, 2]\n",
    ] {
        let errors: Vec<String> = validator
            .iter_errors(&grid(ok))
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{ok}: {errors:?}");
    }
    for bad in [
        "[sweep]\n\"loader.wokers\" = [0, 2]\n",
        "[sweep.loader]\nwokers = [0, 2]\n",
        "[sweep]\nname = [\"a\", \"b\"]\n",
        "[sweep]\n\"slurm.time\" = [\"1:00:00\"]\n",
        "[sweep]\n\"loader.workers\" = 2\n",
    ] {
        assert!(!validator.is_valid(&grid(bad)), "the schema accepts {bad}");
    }
    // A value out of one key's range is refused by the schema as by the runner, so an
    // editor marks it (the schema took each of these, which validation refuses).
    let quickstart = as_json(&root().join("recipes/quickstart.toml"));
    let with = |table: &str, key: &str, value: &str| {
        let mut v = quickstart.clone();
        let parsed: serde_json::Value = serde_json::from_str(value).unwrap();
        v.as_object_mut()
            .unwrap()
            .entry(table)
            .or_insert_with(|| serde_json::json!({}))[key] = parsed;
        v
    };
    for (table, key, value) in [
        ("loader", "batch_size", "0"),
        ("loader", "prefetch", "0"),
        ("loader", "prefetch", "2000"),
        ("run", "epochs", "0"),
        ("run", "max_steps", "0"),
        ("log", "every", "0"),
        ("optim", "accumulation_steps", "0"),
        ("optim", "lr", "-1.0"),
        ("optim", "lr", "0.0"),
        ("optim", "label_smoothing", "1.0"),
        ("checkpoint", "keep", "0"),
        ("model", "width", "0"),
        ("model", "num_classes", "1"),
        ("model", "dropout", "1.0"),
        ("data", "validation", "1.5"),
        ("data", "validation", "0.0"),
        ("model", "embed_dim", "0"),
        ("model", "embed_dim", "8193"),
        ("model", "layers", "65"),
        ("model", "heads", "257"),
        ("model", "ff_dim", "0"),
        ("loader", "workers", "257"),
        ("padding", "max_length", "0"),
        ("padding", "max_length", "65537"),
        ("padding", "multiple_of", "0"),
    ] {
        let v = with(table, key, value);
        assert!(
            !validator.is_valid(&v),
            "the schema accepts {table}.{key} = {value}"
        );
        let out = runner_cmd()
            .args(["validate", "recipes/quickstart.toml", "--set"])
            .arg(format!("{table}.{key}={value}"))
            .output()
            .unwrap();
        expect_exit(&out, 2);
    }
    // And the edges it takes, the runner takes.
    for (table, key, value) in [
        ("loader", "prefetch", "1024"),
        ("optim", "label_smoothing", "0.0"),
        ("model", "dropout", "0.0"),
        ("data", "validation", "0.5"),
        ("loader", "workers", "256"),
        ("model", "layers", "64"),
        ("padding", "max_length", "65536"),
    ] {
        let v = with(table, key, value);
        assert!(
            validator.is_valid(&v),
            "the schema refuses {table}.{key} = {value}"
        );
    }
}

/// A recipe that is not UTF-8 says where; a --set value that is TOML for several keys is
/// refused instead of the keys after the first being dropped.
#[test]
fn a_non_utf8_recipe_and_a_multi_key_set_are_refused_with_where() {
    let dir = tempdir("non-utf8");
    let recipe = tiny_recipe(&dir, "u", "");
    let mut bytes = std::fs::read(&recipe).unwrap();
    let second_line = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    bytes.splice(second_line..second_line, b"# caf\xe9\n".iter().copied());
    let latin1 = dir.join("latin1.toml");
    std::fs::write(&latin1, bytes).unwrap();
    // `runner validate FILE [--set KV]`: refused (exit 2), with this on stderr.
    let refused = |file: &Path, set: &[&str], want: &str| {
        let out = runner_cmd()
            .arg("validate")
            .arg(file)
            .args(set)
            .output()
            .unwrap();
        expect_exit(&out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{stderr}");
    };
    refused(
        &latin1,
        &[],
        "line 2, column 6 is not UTF-8 text (byte 0xe9)",
    );
    // A path that is not a recipe at all is not read without end (`/dev/zero` grew the
    // process to 6.8 GB before), nor is a file past the size a recipe could have.
    let big = dir.join("big.toml");
    std::fs::write(&big, "#".repeat(5 << 20)).unwrap();
    for file in [Path::new("/dev/zero"), &big] {
        refused(file, &[], "cannot read recipe: more than 4 MiB");
    }
    // Nor is a device that reads empty taken for an empty recipe ("data.format: missing").
    refused(
        Path::new("/dev/null"),
        &[],
        "cannot read recipe: a device, not a file (it reads empty)",
    );
    refused(
        &recipe,
        &["--set", "name=\"a\"\nseed=5"],
        "the value of `name` holds more keys after it",
    );
    // A wrong value given on the command line is shown there, not at the recipe's first
    // line or a table header of the file (as a swept list, and as a key below a value).
    refused(
        &recipe,
        &["--set", "sweep.optim.lr=[0.1, \"x\"]"],
        "error: --set: optim.lr: invalid type: string \"x\"",
    );
    refused(
        &recipe,
        &["--set", "loader.workers.x=1"],
        "error: --set: loader.workers: invalid type: table",
    );
    // A number past TOML's range is said to be one, not "a string, write it without quotes".
    refused(
        &recipe,
        &["--set", "seed=18446744073709551615"],
        "seed: 18446744073709551615 is not a TOML integer",
    );
    refused(
        &root().join("recipes/text/rotten_tomatoes.toml"),
        &["--set", "padding.multiple_of=100000"],
        "padding.multiple_of: 100000 is more than padding.max_length (64): every row would be padded to 100000 tokens",
    );
    refused(
        &recipe,
        &["--set", "optim.lr=1e400"],
        "error: --set: optim.lr: 1e400 is too large for a float",
    );
    // A number Rust reads but TOML does not: the form TOML reads, not "drop the quotes".
    refused(
        &recipe,
        &["--set", "optim.lr=.001"],
        "help: write 0.001, without quotes (TOML writes numbers with a digit on each side",
    );
    refused(
        &recipe,
        &["--set", "loader.workers=04"],
        "help: write 4: TOML integers have no leading zeros",
    );
    refused(
        &recipe,
        &["--set", "loader.batch_size=1_0_"],
        "help: write 10: in TOML an underscore goes between two digits",
    );
    // A list of numbers given one number TOML does not read: the list of it, unquoted.
    refused(
        &recipe,
        &["--set", "data.normalize.mean=01"],
        "help: write an array: [1] (on the command line: --set 'data.normalize.mean=[1]')",
    );
    refused(
        &recipe,
        &["--set", "extends=x.toml"],
        "error: --set: extends cannot be set with --set",
    );
    // An override without its --set is taken for a recipe's path: the --set is suggested.
    let out = runner_cmd()
        .args(["validate", "loader.workers=1"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("help: to change a key of a recipe: runner RECIPE --set 'loader.workers=1'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // For a key that takes no number, digits are a word, as any text TOML does not read
    // (the help said to write 7, which was refused next as no string).
    for word in ["007", "1e400"] {
        let out = runner_cmd()
            .args(["show"])
            .arg(&recipe)
            .args(["--set", &format!("name={word}")])
            .output()
            .unwrap();
        expect_exit(&out, 0);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("name = \"{word}\"")),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // Text that TOML reads as another type, a removal given a value, words in an array:
    // each with the --set to write (none had one, or a wrong one).
    refused(&recipe, &["--set", "name=nan"], "help: write it in quotes");
    refused(
        &recipe,
        &["--set", "~optim.lr=3"],
        "help: to remove it: --set '~optim.lr'; to set it: --set 'optim.lr=3'",
    );
    refused(
        &recipe,
        &["--set", "cleanup.actions=[trim_host, sync]"],
        r#"--set 'cleanup.actions=["trim_host", "sync"]'"#,
    );
    refused(
        &recipe,
        &["--set", "data.normalize={on=host}"],
        r#"--set 'data.normalize={on = "host"}'"#,
    );
    refused(
        &recipe,
        &["--set", "cleanup.actions=trim_host"],
        r#"help: write an array: ["trim_host"] (on the command line: --set 'cleanup.actions=["trim_host"]')"#,
    );
    refused(
        &recipe,
        &["--set", "description=123"],
        r#"write it in quotes, "123""#,
    );
    refused(
        &recipe,
        &["--set", "~optim.lr="],
        "help: to remove it: --set '~optim.lr'\n",
    );
}

#[test]
fn a_set_key_may_be_quoted_as_in_a_recipe_file() {
    let dir = tempdir("quoted-set");
    let recipe = tiny_recipe(&dir, "q", "");
    // The [sweep] table's keys are written quoted in files; --set takes them both ways.
    for key in [
        "sweep.\"loader.workers\"",
        "sweep.loader.workers",
        "\"loader\".workers",
    ] {
        let set = if key.starts_with("sweep") {
            format!("{key}=[0, 1]")
        } else {
            format!("{key}=1")
        };
        let out = runner_cmd()
            .arg("validate")
            .arg(&recipe)
            .args(["--set", &set])
            .output()
            .unwrap();
        expect_exit(&out, 0);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let want = if key.starts_with("sweep") {
            "grid of 2 cells: q/workers=0 | q/workers=1"
        } else {
            "ok: "
        };
        assert!(stdout.contains(want), "{set}: {stdout}");
    }
}

#[test]
fn validate_says_what_a_step_holds() {
    let dir = tempdir("step-holds");
    let recipe = tiny_recipe(&dir, "s", "");
    // 100 samples: 4 batches of 32 an epoch; steps do not span epochs.
    let out = runner_cmd()
        .arg("validate")
        .arg(&recipe)
        .args(["--set", "optim.accumulation_steps=1000"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        stdout.contains("(s: 1 optimizer step of 32 × 4 samples)"),
        "{stdout}"
    );
    assert!(
        stderr.contains(
            "optim.accumulation_steps: 1000 is more than the 4 micro-batches of an epoch"
        ),
        "{stderr}"
    );
    let out = runner_cmd()
        .arg("validate")
        .arg(&recipe)
        .args(["--set", "loader.batch_size=500"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 optimizer step of 100 × 1 samples"));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("loader.batch_size: 500 is more than the 100 training samples"));
}

#[test]
fn a_label_only_the_test_file_has_is_warned_of() {
    let dir = tempdir("stray-test-label");
    let line = |label: u32, text: &str| format!("{{\"label\": {label}, \"text\": \"{text}\"}}\n");
    std::fs::write(dir.join("train.jsonl"), line(0, "bad") + &line(1, "good")).unwrap();
    std::fs::write(dir.join("test.jsonl"), line(1, "fine") + &line(5, "odd")).unwrap();
    let recipe = dir.join("t.toml");
    std::fs::write(
        &recipe,
        "[model]\narch = \"bag\"\n[data]\nformat = \"jsonl\"\ntrain = \"train.jsonl\"\ntest = \"test.jsonl\"\n",
    )
    .unwrap();
    let out = runner_cmd().arg("validate").arg(&recipe).output().unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("data.test: label 5 occurs in the test set, but training labels run up to 1: the model gets 6 classes"),
        "{stderr}"
    );
    // A test file within the training labels: nothing to warn of.
    std::fs::write(dir.join("test.jsonl"), line(1, "fine")).unwrap();
    let out = runner_cmd().arg("validate").arg(&recipe).output().unwrap();
    expect_exit(&out, 0);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("occurs"));
    // One below the training labels' largest, which adds no class: still never trained
    // (it was not said, as the check looked only above the training labels).
    std::fs::write(dir.join("train.jsonl"), line(0, "bad") + &line(3, "good")).unwrap();
    let out = runner_cmd().arg("validate").arg(&recipe).output().unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("data.test: label 1 occurs in the test set but in no training sample: the model never trains that class, and is scored on its test samples"),
        "{stderr}"
    );
    // Past data.test_limit a label is not scored: nothing to say of it.
    std::fs::write(dir.join("test.jsonl"), line(0, "fine") + &line(1, "odd")).unwrap();
    let out = with_sets("validate", &recipe, &["data.test_limit=1"]);
    expect_exit(&out, 0);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("occurs"));
    // The test set the training file itself: its accuracy is of data trained on.
    std::fs::copy(dir.join("train.jsonl"), dir.join("test.jsonl")).unwrap();
    let out = runner_cmd().arg("validate").arg(&recipe).output().unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "data.test: {} holds the same bytes as the training file {} (",
            dir.join("test.jsonl").display(),
            dir.join("train.jsonl").display()
        )) && !stderr.contains("occurs"),
        "{stderr}"
    );
}

/// CIFAR-10 files are held to what JSON Lines are: a file of zero bytes only (allocated,
/// never written) is refused, zero records at a file's end are warned of with where they
/// start, and so are one training class, a test class never trained, and a test or
/// validation file that is the training data. All of it trained in silence.
#[test]
fn cifar_files_of_zeros_one_class_or_the_training_data_are_said() {
    let dir = tempdir("cifar-findings");
    const RECORD: usize = 3073;
    let records = |labels: &[u8], zeros: usize| {
        let mut bytes = vec![];
        for (i, &l) in labels.iter().enumerate() {
            bytes.push(l);
            bytes.extend((0..RECORD - 1).map(|k| (k * 7 + i * 13 + 1) as u8 | 1));
        }
        bytes.resize(bytes.len() + zeros * RECORD, 0);
        bytes
    };
    let recipe = dir.join("c.toml");
    std::fs::write(
        &recipe,
        "[model]\narch = \"mlp\"\n[data]\nformat = \"cifar10-bin\"\ntrain = \"train.bin\"\ntest = \"test.bin\"\n",
    )
    .unwrap();
    let validate = |train: &[u8], test: &[u8], sets: &[&str]| {
        std::fs::write(dir.join("train.bin"), train).unwrap();
        std::fs::write(dir.join("test.bin"), test).unwrap();
        let mut cmd = runner_cmd();
        cmd.arg("validate").arg(&recipe);
        for s in sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = validate(&records(&[], 4), &records(&[0, 1], 0), &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "data.train: {} holds zero bytes only: its 4 record(s) would train as black images of class 0",
            dir.join("train.bin").display()
        )),
        "{stderr}"
    );
    let (code, stderr) = validate(&records(&[0, 1, 2, 1], 2), &records(&[0, 1], 0), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "data.train: {}: its last 2 of 6 records (from record 4, byte offset 12292) are zero bytes only",
            dir.join("train.bin").display()
        ))
            && stderr.contains("truncate -s 12292 FILE"),
        "{stderr}"
    );
    // A test file's are scored, not trained on; zeros past data.limit are never read.
    let (_, stderr) = validate(
        &records(&[0, 1, 2, 1], 2),
        &records(&[0, 1], 1),
        &["data.limit=4"],
    );
    assert!(
        stderr.contains("its last 1 of 3 records (from record 2, byte offset 6146) are zero bytes only, which are scored as black images")
            && !stderr.contains("data.train:"),
        "{stderr}"
    );
    let (code, stderr) = validate(&records(&[3, 3, 3], 0), &records(&[3], 0), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("data.train: every training label is 3: the model learns one class"),
        "{stderr}"
    );
    // Of the records data.limit keeps.
    let (_, stderr) = validate(
        &records(&[3, 3, 4], 0),
        &records(&[3], 0),
        &["data.limit=2"],
    );
    assert!(stderr.contains("every training label is 3"), "{stderr}");
    let (code, stderr) = validate(&records(&[0, 1, 2], 0), &records(&[5, 1, 7], 0), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("data.test: labels 5, 7 occur in the test set but in no training sample: the model never trains those classes, and is scored on their test samples"),
        "{stderr}"
    );
    let train = records(&[0, 1, 2], 0);
    let (code, stderr) = validate(&train, &train, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "data.test: {} holds the same bytes as the training file {} (9219 bytes, CRC-32 ",
            dir.join("test.bin").display(),
            dir.join("train.bin").display()
        )),
        "{stderr}"
    );
    let held = format!(
        "data.validation_file=\"{}\"",
        dir.join("train.bin").display()
    );
    let (code, stderr) = validate(&train, &records(&[0, 1], 0), &[&held]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "data.validation_file: {0} holds the same bytes as the training file {0}",
            dir.join("train.bin").display()
        ))
            && stderr.contains("validation (and so early stopping and model-best) is measured on data the model trains on"),
        "{stderr}"
    );
    // A training file data.limit never reaches is not trained on: scoring it is fine.
    let parts = dir.join("parts");
    std::fs::create_dir_all(&parts).unwrap();
    std::fs::write(parts.join("data_batch_1.bin"), records(&[0, 1, 2], 0)).unwrap();
    std::fs::write(parts.join("data_batch_2.bin"), records(&[2, 1, 0, 1], 0)).unwrap();
    let from_parts = format!("data.train=\"{}\"", parts.display());
    let (code, stderr) = validate(&train, &records(&[2, 1, 0, 1], 0), &[&from_parts]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("holds the same bytes as the training file"),
        "{stderr}"
    );
    let (code, stderr) = validate(
        &train,
        &records(&[2, 1, 0, 1], 0),
        &[&from_parts, "data.limit=3"],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("same bytes"), "{stderr}");
    // A names file beside the test file that is a link to nowhere: an error, as beside
    // the training file (it was passed over).
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("test.bin"), records(&[0, 1], 0)).unwrap();
    std::os::unix::fs::symlink("/nonexistent/names.txt", other.join("batches.meta.txt")).unwrap();
    let elsewhere = format!("data.test=\"{}\"", other.join("test.bin").display());
    let (code, stderr) = validate(&train, &records(&[0], 0), &[&elsewhere]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("data.test: ")
            && stderr.contains("is a link to /nonexistent/names.txt, which does not exist"),
        "{stderr}"
    );
    // Files of their own: none of it.
    let (code, stderr) = validate(&train, &records(&[2, 0], 0), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("data.t"), "{stderr}");
}

#[test]
fn a_set_table_merges_into_the_recipes_table() {
    // As a recipe's table over the one it extends: the keys it does not name stay.
    let out = runner_cmd()
        .current_dir(root())
        .args([
            "show",
            "recipes/quickstart.toml",
            "--set",
            "run={max_steps=3}",
        ])
        .args(["--set", "data.normalize={on=\"device\"}"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let shown = String::from_utf8_lossy(&out.stdout);
    for line in [
        "epochs = 8",
        "max_steps = 3",
        "mean = [0.2193]",
        "on = \"device\"",
    ] {
        assert!(shown.lines().any(|l| l == line), "{line}: {shown}");
    }
}

/// The fuzz test: thousands of mutated recipes (from every shipped recipe and bad-input
/// fixture: lines deleted, duplicated or swapped, values swapped between lines, huge and
/// odd numbers, random bytes, cut files) through `runner validate`, 100 files a process.
/// Never a panic; always exit 0 (valid) or 2 (findings). A failing batch is re-run file
/// by file to name the culprit.
#[test]
fn mutated_recipes_never_crash_validation() {
    use runner::rng::SplitMix64;
    const MUTANTS: usize = 10_000;
    let work = tempdir("fuzz");
    // Mirror the layout so relative data paths still resolve to the shipped data.
    for d in ["datasets", "tests/fixtures/data", "tests/fixtures/sweep"] {
        let link = work.join(d);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(root().join(d), &link).unwrap();
    }
    let mut seeds: Vec<(PathBuf, String)> = vec![];
    for dir in ["recipes", "tests/fixtures/invalid"] {
        for f in toml_files(&root().join(dir)) {
            seeds.push((rel(&f), std::fs::read_to_string(&f).unwrap()));
        }
    }
    let odd = [
        "1e308",
        "-1",
        "0",
        "9223372036854775807",
        "18446744073709551616",
        "nan",
        "inf",
        "-inf",
        "\"\"",
        "[]",
        "{}",
        "true",
        "\"\\u0000\"",
        "4000000000",
        "1e-320",
        "[0, 1e300]",
    ];
    let mut rng = SplitMix64::new(7);
    let mut files = vec![];
    for i in 0..MUTANTS {
        let (path, text) = &seeds[rng.below(seeds.len() as u64) as usize];
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let pick = |rng: &mut SplitMix64, n: usize| rng.below(n.max(1) as u64) as usize;
        for _ in 0..=pick(&mut rng, 3) {
            let n = lines.len();
            match pick(&mut rng, 7) {
                0 if n > 0 => {
                    lines.remove(pick(&mut rng, n));
                }
                1 if n > 0 => {
                    let l = lines[pick(&mut rng, n)].clone();
                    lines.insert(pick(&mut rng, n), l);
                }
                2 if n > 1 => {
                    let (a, b) = (pick(&mut rng, n), pick(&mut rng, n));
                    lines.swap(a, b);
                }
                3 if n > 1 => {
                    // A value from one line onto another key.
                    let (a, b) = (pick(&mut rng, n), pick(&mut rng, n));
                    if let (Some((ka, _)), Some((_, vb))) =
                        (lines[a].split_once('='), lines[b].clone().split_once('='))
                    {
                        lines[a] = format!("{ka}={vb}");
                    }
                }
                4 if n > 0 => {
                    let a = pick(&mut rng, n);
                    if let Some((k, _)) = lines[a].clone().split_once('=') {
                        lines[a] = format!("{k}= {}", odd[pick(&mut rng, odd.len())]);
                    }
                }
                5 => {
                    let junk: String = (0..1 + pick(&mut rng, 12))
                        .map(|_| char::from_u32(rng.below(0x250) as u32).unwrap_or('?'))
                        .collect();
                    let at = pick(&mut rng, n + 1);
                    lines.insert(at, junk);
                }
                _ if n > 0 => {
                    lines.truncate(pick(&mut rng, n));
                }
                _ => {}
            }
        }
        let out = work.join(path).with_file_name(format!(
            "m{i:04}-{}",
            path.file_name().unwrap().to_string_lossy()
        ));
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        std::fs::write(&out, lines.join("\n")).unwrap();
        files.push(out);
    }
    let validate = |batch: &[PathBuf]| {
        runner_cmd()
            .current_dir(&work)
            .arg("validate")
            .args(batch)
            .output()
            .unwrap()
    };
    let bad = |o: &std::process::Output| {
        !matches!(o.status.code(), Some(0 | 2))
            || String::from_utf8_lossy(&o.stderr).contains("panicked")
    };
    let mut invalid = 0;
    for batch in files.chunks(100) {
        let out = validate(batch);
        if bad(&out) {
            for f in batch {
                let one = validate(std::slice::from_ref(f));
                assert!(
                    !bad(&one),
                    "validate crashed ({:?}) on {}:\n{}\n--- stderr:\n{}",
                    one.status.code(),
                    f.display(),
                    std::fs::read_to_string(f).unwrap_or_default(),
                    String::from_utf8_lossy(&one.stderr)
                );
            }
        }
        invalid += String::from_utf8_lossy(&out.stderr)
            .matches("\nerror")
            .count();
    }
    // The mutations do reach validation's errors (not only syntax errors).
    assert!(
        invalid > MUTANTS / 10,
        "only {invalid} findings from {MUTANTS} mutants"
    );
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn ls_lists_every_model_and_data_format_the_format_allows() {
    let out = runner_cmd().arg("ls").output().unwrap();
    expect_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Every shipped recipe, as a path from here, its description in one column.
    let listed: Vec<&str> = stdout
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert_eq!(
        listed.len(),
        toml_files(&root().join("recipes")).len(),
        "{stdout}"
    );
    assert!(
        listed
            .iter()
            .all(|l| l.trim_start().starts_with("recipes/")),
        "{stdout}"
    );
    let at = |l: &&str| {
        let path_end = 2 + l.trim_start().find(' ').unwrap();
        path_end + l[path_end..].find(|c: char| c != ' ').unwrap()
    };
    assert!(
        listed.windows(2).all(|w| at(&w[0]) == at(&w[1])),
        "descriptions out of line:\n{stdout}"
    );
    // Elsewhere: none, and where to run it (it listed the build's checkout).
    let elsewhere = std::env::temp_dir();
    let out = runner_cmd()
        .arg("ls")
        .current_dir(&elsewhere)
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let there = String::from_utf8_lossy(&out.stdout);
    assert!(
        there.starts_with("recipes:\n  (no recipes/ directory here: run `runner ls` in a checkout"),
        "{there}"
    );
    // And the devices each backend.kind would use here, or why there are none.
    let devices = stdout
        .split_once("devices (backend.kind, backend.device):\n")
        .map(|(_, d)| d)
        .unwrap_or_else(|| panic!("no devices section:\n{stdout}"));
    assert!(devices.starts_with("  cpu "), "{devices}");
    if !cfg!(feature = "cuda") {
        assert!(
            devices.contains("cuda         this binary was built without the `cuda` feature"),
            "{devices}"
        );
    }
    if !cfg!(feature = "wgpu") {
        assert!(
            devices.contains("wgpu         this binary was built without the `wgpu` feature"),
            "{devices}"
        );
    }
    let schema = runner::recipe::schema::json_schema();
    let text = serde_json::to_string(&schema).unwrap();
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Every word the schema allows for model.arch and data.format is listed.
    let defs = &schema["$defs"];
    for def in ["Arch", "DataFormat"] {
        let words: Vec<String> = defs[def]["enum"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .or_else(|| {
                defs[def]["oneOf"].as_array().map(|a| {
                    a.iter()
                        .filter_map(|v| v["const"].as_str().map(String::from))
                        .collect()
                })
            })
            .unwrap_or_default();
        assert!(!words.is_empty(), "no {def} in the schema: {}", defs[def]);
        for w in words {
            assert!(
                stdout.contains(&format!("  {w} ")),
                "ls omits {w}:\n{stdout}"
            );
        }
    }
}

/// A missing data file's help says what its path is relative to: the recipe file, or the
/// working directory where the path came from `--set` (it said the recipe file for both).
#[test]
fn a_missing_data_path_says_what_it_is_relative_to() {
    let recipe = root().join("recipes/quickstart.toml");
    let out = runner_cmd()
        .args(["validate", "--set", "data.test=\"nowhere.bin\""])
        .arg(&recipe)
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--set: data.test: nowhere.bin does not exist")
            && err.contains("help: --set paths are relative to the working directory"),
        "{err}"
    );
}

/// A names file saved with a byte-order mark (as Windows editors save) names the same
/// classes as one without: before, the mark was part of the first name, and a test set
/// beside such a file was warned of as having other classes than the training data.
#[test]
fn a_byte_order_mark_in_a_names_file_is_not_part_of_a_name() {
    let dir = tempdir("names-bom");
    let data = root().join("datasets/fashion_mnist");
    std::fs::copy(data.join("test_batch.bin"), dir.join("test_batch.bin")).unwrap();
    let names = std::fs::read_to_string(data.join("batches.meta.txt")).unwrap();
    let validate = |names_file: String| {
        std::fs::write(dir.join("batches.meta.txt"), names_file).unwrap();
        let out = runner_cmd()
            .args(["validate", "recipes/quickstart.toml", "--set"])
            .arg(format!(
                "data.test=\"{}\"",
                dir.join("test_batch.bin").display()
            ))
            .output()
            .unwrap();
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let stderr = validate(format!("\u{feff}{names}"));
    assert!(!stderr.contains("its classes are not"), "{stderr}");
    // And the check is there: another first name is warned of.
    let stderr = validate(names.replacen("T-shirt/top", "Tee", 1));
    assert!(
        stderr.contains("its classes are not the training data's: label 0 is \"Tee\""),
        "{stderr}"
    );
}

/// A validation cadence the run never reaches is warned of: the held-out samples are
/// never evaluated and early stopping never acts (before: nothing said, and `eval --best`
/// then claimed the run had no validation set).
#[test]
fn a_validation_cadence_past_the_run_is_warned_of() {
    let validate = |every: &str| {
        let out = runner_cmd()
            .args(["validate", "recipes/quickstart.toml"])
            .args(["--set", "data.validation=0.1", "--set", "run.max_steps=20"])
            .args(["--set", "run.early_stop={patience=1}", "--set"])
            .arg(format!("run.validate={every}"))
            .output()
            .unwrap();
        expect_exit(&out, 0);
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let stderr = validate("100");
    assert!(
        stderr.contains("run.validate: every 100 steps, but the run has 20: the validation set is never evaluated, so early stopping never acts")
            && stderr.contains("use at most 20, or \"epoch\""),
        "{stderr}"
    );
    let stderr = validate("20");
    assert!(!stderr.contains("never evaluated"), "{stderr}");
}

/// A warning found in a file that several recipes of one call extend is said once, with
/// the recipe that brought it (it was said once per recipe, none named).
#[test]
fn a_shared_warning_is_said_once_naming_the_recipe_that_extends_it() {
    let out = runner_cmd()
        .args([
            "validate",
            "recipes/text/spamassassin_bucket.toml",
            "recipes/text/spamassassin.toml",
        ])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("warning: recipes/text/spamassassin.toml:")
            .count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("= note: recipes/text/spamassassin_bucket.toml extends it"),
        "{err}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).matches("ok: ").count(),
        2
    );
}
