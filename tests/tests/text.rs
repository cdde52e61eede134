//! Variable-length text: padding strategies and the text models.

use burn::tensor::Tensor;

use runner::metrics::Summary;
use runner::model::{Input, Net, Shape};
use runner::plan::{self, Machine};
use runner::recipe;

use crate::common::{
    expect_exit, invalid_quickstart_grid, only_run, records, root, runner_cmd, runner_logged,
    summary, tempdir,
};

// ---------------------------------------------------------------- variable-length text

/// Logits of each text model for two sequences (the first ending in token `last`), with
/// the batch padded to `len` positions.
fn text_logits(arch: &str, extra: &str, len: usize, pad_id: i32, last: i32) -> Vec<f32> {
    use burn::tensor::{Bool, Int, TensorData};
    type B = burn::backend::Flex;
    let src = format!("[model]\narch = \"{arch}\"\n{extra}\n[data]\nformat = \"jsonl\"\ntrain = \"../datasets/rotten_tomatoes/train.jsonl\"\n[padding]\nmax_length = 64\npad_id = {}\n", pad_id.max(0));
    let l = recipe::parse(&root().join("recipes/m.toml"), src).unwrap();
    let p = plan::validate(&l, &Machine::cpu_only()).unwrap_or_else(|r| panic!("{r}"));
    let d = runner::backend::cpu_device();
    let net: Net<B> = Net::new(
        &p.model,
        Shape::Text {
            vocab: 50,
            max_len: 64,
        },
        5,
        &d,
    );
    let seqs: [&[i32]; 2] = [&[5, 9, 2, last], &[3, 3, 8, 1, 4, 6, 2]];
    let mut ids = vec![];
    let mut pad = vec![];
    for s in seqs {
        for j in 0..len {
            ids.push(if j < s.len() { s[j] } else { pad_id });
            pad.push(j >= s.len());
        }
    }
    let input = Input::Tokens {
        ids: Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [2, len]), &d),
        pad: Tensor::<B, 2, Bool>::from_data(TensorData::new(pad, [2, len]), &d),
        lengths: Tensor::<B, 1, Int>::from_data(TensorData::new(vec![4i32, 7], [2]), &d),
    };
    net.forward(input)
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .unwrap()
}

#[test]
fn padding_never_changes_a_sequences_logits() {
    for (arch, extra) in [
        ("bag", "embed_dim = 16\nhidden = [8]"),
        ("lstm", "embed_dim = 16\nhidden_size = 12\nlayers = 2"),
        (
            "transformer",
            "embed_dim = 16\nheads = 2\nlayers = 2\nff_dim = 32\ndropout = 0.0",
        ),
    ] {
        let tight = text_logits(arch, extra, 7, 0, 7);
        for (len, pad_id) in [(16, 0), (40, 0), (16, 11)] {
            let loose = text_logits(arch, extra, len, pad_id, 7);
            for (a, b) in tight.iter().zip(&loose) {
                assert!((a - b).abs() < 1e-5, "{arch}: padding to {len} with id {pad_id} changed the logits: {tight:?} vs {loose:?}");
            }
        }
        // And the comparison can fail: a different last real token changes them.
        let other = text_logits(arch, extra, 7, 0, 8);
        let moved = tight
            .iter()
            .zip(&other)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            moved > 1e-4,
            "{arch}: changing a real token left the logits alone"
        );
    }
}

#[test]
fn a_short_run_on_rotten_tomatoes_beats_chance_and_counts_padding() {
    let body =
        std::fs::read_to_string(root().join("recipes/text/rotten_tomatoes_bucket.toml")).unwrap();
    assert!(body.contains("extends"));
    let logs = tempdir("rt");
    let out = runner_logged(
        &logs,
        &[
            "recipes/text/rotten_tomatoes.toml",
            "--quiet",
            "--set",
            "run.epochs=4",
        ],
        &[],
    );
    expect_exit(&out, 0);
    let dir = only_run(&logs.join("rotten_tomatoes"));
    let s = summary(&dir);
    let acc = s.test_accuracy.unwrap();
    // The test split is 61% positive: beat always-positive, not just a coin.
    assert!(acc > 0.65, "test accuracy {acc}");
    let recs = records(&dir);
    for r in &recs {
        let (real, padded) = (r.real_tokens.unwrap(), r.padded_tokens.unwrap());
        assert!(real <= padded && real > 0);
        let waste = 100.0 * (padded - real) as f64 / padded as f64;
        assert!((r.pad_waste_pct.unwrap() - waste).abs() < 1e-9);
    }
    let total: u64 = recs.iter().map(|r| r.padded_tokens.unwrap()).sum();
    assert_eq!(s.padded_tokens, Some(total));
    let tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap())
            .unwrap();
    assert_eq!(tok["vocab"][0], "<pad>");
    assert_eq!(tok["vocab"][1], "<unk>");
    // What the run wrote is what `runner eval` reads back.
    let out = runner_cmd().arg("eval").arg(&dir).output().unwrap();
    expect_exit(&out, 0);
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with(&format!("accuracy {:.2}%", 100.0 * acc)),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Bucketed batches and accumulation: a step of 4 micro-batches of 16 holds the samples
/// one batch of 64 would (they were bucketed and shuffled one by one: a step mixed buckets,
/// and the losses of 64 × 1 and 16 × 4 differed by up to 0.13), its short step last.
#[test]
fn bucketed_micro_batches_make_the_steps_one_large_batch_would() {
    let logs = tempdir("bucket-accumulation");
    let losses = |name: &str, batch: &str, accumulation: &str| {
        let out = runner_logged(
            &logs,
            &["recipes/text/rotten_tomatoes_bucket.toml", "-q"],
            &[
                "--set",
                &format!("name=\"{name}\""),
                "--set",
                "data.limit=410",
                "--set",
                "run.epochs=2",
                "--set",
                &format!("loader.batch_size={batch}"),
                "--set",
                &format!("optim.accumulation_steps={accumulation}"),
            ],
        );
        expect_exit(&out, 0);
        records(&only_run(&logs.join(name)))
            .iter()
            .map(|r| (r.samples, r.loss))
            .collect::<Vec<_>>()
    };
    let one = losses("one", "64", "1");
    let four = losses("four", "16", "4");
    assert_eq!(one.len(), four.len());
    for (a, b) in one.iter().zip(&four) {
        assert!(a.0 == b.0 && (a.1 - b.1).abs() < 1e-5, "{one:?}\n{four:?}");
    }
    let _ = std::fs::remove_dir_all(&logs);
}

#[test]
fn bucketed_batches_pad_less_than_dynamic_on_the_same_data() {
    let logs = tempdir("buckets");
    let run = |recipe: &str| {
        let out = runner_cmd()
            .args([
                recipe,
                "--quiet",
                "--set",
                "run.epochs=1",
                "--set",
                "run.eval=\"never\"",
                "--set",
            ])
            .arg(format!("log.dir=\"{}\"", logs.display()))
            .output()
            .unwrap();
        expect_exit(&out, 0);
        let name = std::path::Path::new(recipe)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let dir = only_run(&logs.join(name));
        summary(&dir)
    };
    let dynamic = run("recipes/text/spamassassin.toml");
    let bucket = run("recipes/text/spamassassin_bucket.toml");
    let fixed = run("recipes/text/spamassassin_max_length.toml");
    assert_eq!(
        dynamic.real_tokens, bucket.real_tokens,
        "the same tokens, batched differently"
    );
    let pads = |s: &Summary| s.padded_tokens.unwrap() - s.real_tokens.unwrap();
    assert!(
        pads(&bucket) * 10 < pads(&dynamic) * 6,
        "bucket pads {} tokens, dynamic {}",
        pads(&bucket),
        pads(&dynamic)
    );
    assert!(pads(&dynamic) <= pads(&fixed));
    assert_eq!(
        fixed.padded_tokens.unwrap() % 1024,
        0,
        "max_length pads every row to 1024"
    );
}

#[test]
fn text_recipes_are_checked_like_any_other() {
    let bad = |src: &str| {
        let l = recipe::parse(&root().join("recipes/text/x.toml"), src.into()).unwrap();
        plan::validate(&l, &Machine::cpu_only())
            .unwrap_err()
            .to_string()
    };
    let e = bad("[model]\narch = \"small_cnn\"\n[data]\nformat = \"synthetic\"\n[padding]\nstrategy = \"bucket\"\n");
    assert!(
        e.contains("x.toml:5:1: padding: applies to text data (format = \"jsonl\")"),
        "{e}"
    );
    // The same through a dotted --set into the table, which was taken and ignored; and
    // an image key on text data.
    for (recipe, set, want) in [
        (
            "recipes/quickstart.toml",
            "padding.max_length=5",
            "--set: padding: applies to text data",
        ),
        (
            "recipes/quickstart.toml",
            "data.tokenizer.kind=\"byte\"",
            "--set: data.tokenizer: only applies to text data",
        ),
        (
            "recipes/text/rotten_tomatoes.toml",
            "data.augment.hflip=true",
            "--set: data.augment: only applies to image data",
        ),
    ] {
        let out = runner_cmd()
            .args(["validate", recipe, "--set", set])
            .output()
            .unwrap();
        expect_exit(&out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{set}: {stderr}");
        // The user's own --set made the table: the help says to leave it out, not to
        // remove it with '~' (which would take back that --set).
        if want.contains("only applies") {
            assert!(
                stderr.contains("help: leave this --set out"),
                "{set}: {stderr}"
            );
        }
    }
    // An out-of-range width is one error, not also one for the ff_dim it defaults.
    let out = runner_cmd()
        .args(["validate", "recipes/text/rotten_tomatoes.toml"])
        .args(["--set", "model.embed_dim=0"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("model.embed_dim: 0 is out of range") && !stderr.contains("ff_dim"),
        "{stderr}"
    );
    // And through a grid's axis over a key under it (two cells of one run), said once.
    let dir = tempdir("not-for-images");
    for (axis, want) in [
        (
            "\"padding.max_length\" = [5, 10]",
            "padding: applies to text data",
        ),
        (
            "\"data.tokenizer.kind\" = [\"byte\", \"word\"]",
            "data.tokenizer: only applies to text data",
        ),
    ] {
        let stderr = invalid_quickstart_grid(&dir, axis);
        assert!(
            stderr.contains(&format!("g.toml:3:1: {want}")) && stderr.contains("1 error in"),
            "{axis}: {stderr}"
        );
    }
    let e = bad("[model]\narch = \"lstm\"\n[data]\nformat = \"synthetic\"\n");
    assert!(
        e.contains("model.arch: lstm reads token sequences, but the data are images"),
        "{e}"
    );
    let e = bad("[model]\narch = \"transformer\"\nembed_dim = 30\nheads = 4\n[data]\nformat = \"jsonl\"\ntrain = \"../../datasets/rotten_tomatoes/train.jsonl\"\n");
    assert!(
        e.contains("model.heads: 4 heads do not divide embed_dim = 30"),
        "{e}"
    );
    let e = bad("[model]\narch = \"bag\"\n[data]\nformat = \"jsonl\"\ntrain = \"../../datasets/rotten_tomatoes/train.jsonl\"\n[padding]\nstrategy = \"dynamic\"\nbuckets = 4\nmultiple_of = 0\n");
    assert!(
        e.contains("padding.buckets: only applies to strategy = \"bucket\"")
            && e.contains("padding.multiple_of: 0 cannot be a multiple"),
        "{e}"
    );
    // A bad line in the data is found when the recipe is checked, with its file and line.
    let dir = tempdir("badjsonl");
    std::fs::write(
        dir.join("t.jsonl"),
        "{\"label\": 0, \"text\": \"fine\"}\n{\"label\": 1, \"txt\": \"typo\"}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("r.toml"),
        "[model]\narch = \"bag\"\n[data]\nformat = \"jsonl\"\ntrain = \"t.jsonl\"\n",
    )
    .unwrap();
    let out = runner_cmd()
        .arg("validate")
        .arg(dir.join("r.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("t.jsonl line 2: no field \"text\" (the line has \"label\", \"txt\")"),
        "{err}"
    );
    // A test file with no records (empty, or blank lines) is an error, as an empty CIFAR
    // file is: the run turned its evaluation off and exited 0.
    std::fs::write(dir.join("empty.jsonl"), "\n \n").unwrap();
    let rotten = root().join("datasets/rotten_tomatoes/train.jsonl");
    std::fs::write(
        dir.join("e.toml"),
        format!("[model]\narch = \"bag\"\n[data]\nformat = \"jsonl\"\ntrain = \"{}\"\ntest = \"empty.jsonl\"\n", rotten.display()),
    )
    .unwrap();
    let out = runner_cmd().arg(dir.join("e.toml")).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("data.test: ")
            && err.contains("empty.jsonl holds no records: it is empty, or only blank lines"),
        "{err}"
    );
}

/// A grid over a key that decides whether another applies (`padding.strategy` over the
/// bucket recipe, `data.tokenizer.kind` over a word tokenizer's settings) validates, with
/// a warning for the cells the key does not apply to (it was an error pointing at the base
/// file, with advice that broke the other cells); each cell's resolved recipe runs on its
/// own. Sweeping such a key itself where it has no effect is still an error.
#[test]
fn a_grid_may_sweep_a_key_that_others_depend_on() {
    let text = root().join("recipes/text");
    for (recipe, axis, cells) in [
        (
            "spamassassin_bucket.toml",
            "sweep.\"padding.strategy\"=[\"dynamic\", \"max_length\", \"bucket\"]",
            3,
        ),
        (
            "rotten_tomatoes.toml",
            "sweep.\"data.tokenizer.kind\"=[\"word\", \"byte\"]",
            2,
        ),
    ] {
        let recipe = text.join(recipe);
        let out = runner_cmd()
            .args(["validate", "--set", axis])
            .arg(&recipe)
            .output()
            .unwrap();
        expect_exit(&out, 0);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("warning: ") && err.contains("ignored in the cells it does not apply to"),
            "{err}"
        );
        let dir = tempdir(&format!("dependent-{cells}"));
        for cell in 0..cells {
            let out = runner_cmd()
                .args(["show", "--set", axis, "--cell", &cell.to_string()])
                .arg(&recipe)
                .output()
                .unwrap();
            expect_exit(&out, 0);
            let alone = dir.join(format!("cell{cell}.toml"));
            std::fs::write(&alone, &out.stdout).unwrap();
            let out = runner_cmd().arg("validate").arg(&alone).output().unwrap();
            expect_exit(&out, 0);
            // No finding but the count of texts its max_length cuts (SpamAssassin's).
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr
                    .lines()
                    .filter(|l| l.starts_with("warning") || l.starts_with("error"))
                    .all(|l| l.contains("padding.max_length: ") && l.contains("training texts")),
                "{stderr}"
            );
        }
    }
    let out = runner_cmd()
        .args(["validate", "--set", "sweep.\"padding.buckets\"=[4, 8]"])
        .arg(text.join("rotten_tomatoes.toml"))
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("padding.buckets: only applies to strategy = \"bucket\""));
}

/// The memory pre-flight counts what the data can make: under `dynamic` and `bucket` a row
/// is as long as the batch's longest text, not `max_length`, and a word vocabulary holds at
/// most the training file's distinct words, not `max_vocab`. Both were taken at their caps,
/// so runs that fit were refused (here over the 4 TiB any machine is held to; on this
/// machine already `max_length = 4096` with 60-token texts, as 32.8 GiB of attention).
#[test]
fn the_memory_check_counts_the_texts_not_the_caps() {
    let recipe = root().join("recipes/text/rotten_tomatoes_transformer.toml");
    let validate = |sets: &[&str]| {
        let mut c = runner_cmd();
        c.arg("validate").arg(&recipe);
        for s in sets {
            c.args(["--set", s]);
        }
        c.output().unwrap()
    };
    expect_exit(&validate(&["padding.max_length=65536"]), 0);
    expect_exit(&validate(&["data.tokenizer.max_vocab=100000000000000"]), 0);
    // Where every row is padded to max_length, it is what counts; the help says how not to.
    let out = validate(&[
        "padding.max_length=65536",
        "padding.strategy=\"max_length\"",
    ]);
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("loader.batch_size") && err.contains("padding.strategy = \"dynamic\""),
        "{err}"
    ); // A validation file's batches are padded as training's are: its longest text counts
       // (a 65,536-word review there needs what max_length = 65536 does).
    let dir = tempdir("longest-validation");
    let long = dir.join("validation.jsonl");
    let text = "word ".repeat(65536);
    std::fs::write(
        &long,
        format!("{{\"label\": 1, \"text\": \"{text}\"}}\n{{\"label\": 0, \"text\": \"short\"}}\n"),
    )
    .unwrap();
    let out = validate(&[
        "padding.max_length=65536",
        &format!("data.validation_file={:?}", long.display().to_string()),
    ]);
    expect_exit(&out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loader.batch_size"), "{err}");
    // The same file with that text cut to one word fits.
    std::fs::write(
        &long,
        "{\"label\": 1, \"text\": \"word\"}\n{\"label\": 0, \"text\": \"short\"}\n",
    )
    .unwrap();
    expect_exit(
        &validate(&[
            "padding.max_length=65536",
            &format!("data.validation_file={:?}", long.display().to_string()),
        ]),
        0,
    );
}

/// Labels that leave the run meaningless are said before it runs: one class only (its test
/// accuracy was 100%), or 1-based labels (class 0 never trained, without a word).
#[test]
fn one_class_or_one_based_labels_are_warned() {
    let dir = tempdir("label-warnings");
    // Of the texts trained on: data.validation holds the only label 0 out (23 of 24 texts
    // are label 1; 22 held out), so training sees label 1 alone, and never class 0.
    let rows: String = std::iter::once("{\"text\": \"z\", \"label\": 0}\n".to_string())
        .chain((0..23).map(|i| format!("{{\"text\": \"w{i}\", \"label\": 1}}\n")))
        .collect();
    let file = dir.join("held.jsonl");
    std::fs::write(&file, rows).unwrap();
    let out = runner_cmd()
        .args(["validate", "recipes/text/rotten_tomatoes.toml", "--set"])
        .arg(format!("data.train=\"{}\"", file.display()))
        .args([
            "--set",
            "data.validation=0.9",
            "--set",
            "~data.test",
            "--set",
            "run.eval=\"never\"",
        ])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("data.train: every training label is 1: the model learns one class"),
        "{stderr}"
    );
    for (rows, want) in [
        (
            "{\"text\": \"a b\", \"label\": 0}\n{\"text\": \"c\", \"label\": 0}\n",
            "data.train: every training label is 0: the model learns one class",
        ),
        (
            "{\"text\": \"a b\", \"label\": 1}\n{\"text\": \"c\", \"label\": 3}\n",
            "data.train: no training label is 0: labels run from 1 to 3, so the model gets 4 classes and class 0 is never trained",
        ),
        ("{\"text\": \"a b\", \"label\": 0}\n{\"text\": \"c\", \"label\": 1}\n", ""),
    ] {
        let file = dir.join("t.jsonl");
        std::fs::write(&file, rows).unwrap();
        let out = runner_cmd()
            .args(["validate", "recipes/text/rotten_tomatoes.toml", "--set"])
            .arg(format!("data.train=\"{}\"", file.display()))
            .args(["--set", "~data.test", "--set", "run.eval=\"never\""])
            .output()
            .unwrap();
        expect_exit(&out, 0);
        let stderr = String::from_utf8_lossy(&out.stderr);
        match want {
            "" => assert!(!stderr.contains("data.train:"), "{stderr}"),
            _ => assert!(stderr.contains(want), "{stderr}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What would train on nothing, in silence, is warned: texts with no word (each one
/// unknown token, all alike to the model), a `min_freq` no word reaches (no vocabulary), a
/// `pad_id` past the vocabulary (an embedding table of a million unused rows); a stray
/// label is blamed on the file it is in; `num_classes = 0` is said at its key (every line's
/// label was called out of range).
#[test]
fn text_that_would_train_on_nothing_is_warned() {
    let dir = tempdir("text-nothing");
    let train = dir.join("train.jsonl");
    std::fs::write(
        &train,
        "{\"text\": \"\", \"label\": 0}\n{\"text\": \"a good film\", \"label\": 1}\n{\"text\": \" \", \"label\": 0}\n{\"text\": \"a bad one\", \"label\": 1}\n",
    )
    .unwrap();
    let test = dir.join("test.jsonl");
    std::fs::write(&test, "{\"text\": \"a film\", \"label\": 40}\n").unwrap();
    let validate = |sets: &[&str]| {
        let mut cmd = runner_cmd();
        cmd.args(["validate", "recipes/text/rotten_tomatoes.toml", "--set"])
            .arg(format!("data.train=\"{}\"", train.display()))
            .arg("--set")
            .arg(format!("data.test=\"{}\"", test.display()));
        for s in sets {
            cmd.args(["--set", s]);
        }
        cmd.output().unwrap()
    };
    let out = validate(&["data.tokenizer.min_freq=3", "padding.pad_id=100000"]);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for want in [
        "data.train: 2 of the 4 texts of",
        "have no word (empty, or only white space), the first being text 1",
        "data.tokenizer.min_freq: 3 is more than any training word occurs (the most frequent, 2 times)",
        "padding.pad_id: 100000 is past the vocabulary's 2 ids",
        "data.test: labels run up to 40, so the model gets 41 classes, but only 3 distinct labels occur in the training and test files",
    ] {
        assert!(stderr.contains(want), "{want}\n{stderr}");
    }
    // Of the texts the limits keep: those past them are never read.
    let out = validate(&[
        "data.limit=2",
        "data.test_limit=1",
        "data.tokenizer.min_freq=2",
        "padding.pad_id=6",
    ]);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for want in [
        "data.train: 1 of the first 2 texts of",
        "min_freq: 2 is more than any training word occurs (the most frequent, once)",
        "padding.pad_id: 6 is past the vocabulary's 2 ids",
    ] {
        assert!(stderr.contains(want), "{want}\n{stderr}");
    }
    // A label only the texts past data.limit have is a class never trained.
    let past = dir.join("past.jsonl");
    std::fs::write(
        &past,
        "{\"text\": \"a\", \"label\": 0}\n{\"text\": \"b\", \"label\": 1}\n{\"text\": \"c\", \"label\": 5}\n",
    )
    .unwrap();
    let out = validate(&[
        &format!("data.train=\"{}\"", past.display()),
        "data.limit=2",
        "~data.test",
        "run.eval=\"never\"",
    ]);
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("data.limit: label 5 occurs in the training file past its first 2 texts: the model gets 6 classes"),
        "{stderr}"
    );
    // Nor of the texts data.validation holds out: the vocabulary is built without them.
    // "shared" is in all 10 texts, so in the 5 trained on.
    let split = dir.join("split.jsonl");
    let rows: String = (0..10)
        .map(|i| format!("{{\"text\": \"shared w{i}\", \"label\": {}}}\n", i % 2))
        .collect();
    std::fs::write(&split, rows).unwrap();
    let on_split = |sets: &[&str], want: &str| {
        let train = format!("data.train=\"{}\"", split.display());
        let mut all = vec![
            train.as_str(),
            "~data.test",
            "run.eval=\"never\"",
            "data.validation=0.5",
        ];
        all.extend_from_slice(sets);
        let out = validate(&all);
        expect_exit(&out, 0);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{want}\n{stderr}");
    };
    on_split(
        &["data.tokenizer.min_freq=6"],
        "min_freq: 6 is more than any training word occurs (the most frequent, 5 times)",
    );
    on_split(
        &["padding.pad_id=9"],
        "padding.pad_id: 9 is past the vocabulary's 8 ids",
    );
    // The vocabulary keeps only the words seen min_freq times: "shared" (5 times), no wN.
    // Ids run 0..3: 3 is past them, and one row of the four is never used.
    on_split(
        &["data.tokenizer.min_freq=2", "padding.pad_id=3"],
        "padding.pad_id: 3 is past the vocabulary's 3 ids: the embedding table grows to 4 rows to hold it, 1 of them never used",
    );
    let out = validate(&["model.num_classes=0"]);
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("model.num_classes: 0 classes: too few")
            && !stderr.contains("out of range"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Texts cut to `padding.max_length` are counted before the run: the cut was silent, and
/// the run's token counts were of what was left.
#[test]
fn texts_cut_by_max_length_are_counted() {
    let out = runner_cmd()
        .args(["validate", "recipes/text/rotten_tomatoes.toml"])
        .args(["--set", "padding.max_length=20"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Counted independently: words as the tokenizer splits them (letters and digits, or
    // any other non-space character alone), lower-cased.
    let text =
        std::fs::read_to_string(root().join("datasets/rotten_tomatoes/train.jsonl")).unwrap();
    let lens: Vec<usize> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            runner::data::text::words(&v["text"].as_str().unwrap().to_lowercase()).count()
        })
        .collect();
    let cut = lens.iter().filter(|&&n| n > 20).count();
    let longest = lens.iter().max().unwrap();
    assert!(cut > 0);
    assert!(
        stderr.contains(&format!(
            "padding.max_length: {cut} of the {} training texts",
            lens.len()
        )) && stderr.contains(&format!("(the longest has {longest})")),
        "{stderr}"
    );
    // Of the texts the run uses, the first data.limit (it counted the whole file).
    let out = runner_cmd()
        .args(["validate", "recipes/text/rotten_tomatoes.toml"])
        .args(["--set", "padding.max_length=20", "--set", "data.limit=300"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = &lens[..300];
    let (cut, longest) = (
        first.iter().filter(|&&n| n > 20).count(),
        first.iter().max().unwrap(),
    );
    assert!(
        stderr.contains(&format!(
            "padding.max_length: {cut} of the 300 training texts"
        )) && stderr.contains(&format!("(the longest has {longest})")),
        "{stderr}"
    );
    let out = runner_cmd()
        .args(["validate", "recipes/text/rotten_tomatoes.toml"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("padding.max_length"));
}
