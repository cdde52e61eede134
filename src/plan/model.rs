//! The `[model]` rules: architecture, per-architecture knobs, class count, caps.

use super::*;

impl<'a> Validator<'a> {
    pub(super) fn model(&mut self, data: Option<&DataPlan>) -> Option<ModelPlan> {
        let m = &self.recipe().model;
        let Some(arch) = m.arch else {
            self.err(
                "model.arch",
                "missing: every recipe names its model",
                "add `arch = \"small_cnn\"` (or resnet18, resnet34, resnet50, mlp; bag, lstm, transformer for text) under [model]",
            );
            return None;
        };
        self.arch_keys(arch);
        let net = self.net(arch);
        let num_classes = self.model_fits_data(arch, data?);
        Some(ModelPlan { num_classes, net })
    }

    /// The architecture's knobs: defaults, ranges, and the plan of the network.
    fn net(&mut self, arch: Arch) -> NetPlan {
        let m = &self.recipe().model;
        let embed_dim = m.embed_dim.unwrap_or(64);
        let heads = m.heads.unwrap_or(4);
        let layers = m
            .layers
            .unwrap_or(if arch == Arch::Transformer { 2 } else { 1 });
        let hidden_size = m.hidden_size.unwrap_or(128);
        // The default of an out-of-range width stays in range: `4 * embed_dim` wrapped
        // past what TOML can hold.
        // Nor is an out-of-range embed_dim blamed twice: a default ff_dim of 0 named a key
        // the recipe never set (and that only the Transformer has).
        let ff_dim = m.ff_dim.unwrap_or(4 * embed_dim.clamp(1, 8192));
        let dropout = m.dropout.unwrap_or(0.1);
        for (key, v, hi) in [
            ("model.embed_dim", embed_dim, 8192),
            ("model.hidden_size", hidden_size, 8192),
            ("model.layers", layers, 64),
            ("model.heads", heads, 256),
            ("model.ff_dim", ff_dim, 65536),
        ] {
            if !(1..=hi).contains(&v) {
                self.err(
                    key,
                    format!("{v} is out of range"),
                    format!("use 1 to {hi}"),
                );
            }
        }
        if arch == Arch::Transformer
            && (1..=256).contains(&heads)
            && (1..=8192).contains(&embed_dim)
            && !embed_dim.is_multiple_of(heads)
        {
            self.err(
                "model.heads",
                format!("{heads} heads do not divide embed_dim = {embed_dim}"),
                format!(
                    "pick heads that divide the model width, e.g. {} for {embed_dim}",
                    dividing_heads(embed_dim, heads)
                ),
            );
        }
        if !(0.0..1.0).contains(&dropout) {
            self.err(
                "model.dropout",
                format!("{dropout} is outside [0, 1)"),
                "0.1 is usual",
            );
        }
        let width = m.width.unwrap_or(32);
        if !(1..=1024).contains(&width) {
            self.err(
                "model.width",
                format!("{width} is out of range"),
                "use 1 to 1024 channels",
            );
        }
        let hidden =
            m.hidden
                .clone()
                .unwrap_or_else(|| if arch == Arch::Bag { vec![] } else { vec![256] });
        if hidden.contains(&0) {
            self.err(
                "model.hidden",
                "a hidden layer of size 0",
                "every size must be at least 1",
            );
        }
        let stem = m.stem.unwrap_or(Stem::Cifar);
        match arch {
            Arch::Resnet18 => NetPlan::Resnet18 { stem },
            Arch::Resnet34 => NetPlan::Resnet34 { stem },
            Arch::Resnet50 => NetPlan::Resnet50 { stem },
            Arch::SmallCnn => NetPlan::SmallCnn { width },
            Arch::Mlp => NetPlan::Mlp { hidden },
            Arch::Bag => NetPlan::Bag { embed_dim, hidden },
            Arch::Lstm => NetPlan::Lstm {
                embed_dim,
                hidden_size,
                layers,
            },
            Arch::Transformer => NetPlan::Transformer(TransformerPlan {
                embed_dim,
                heads,
                layers,
                ff_dim,
                dropout,
            }),
        }
    }

    /// Keys that belong to other architectures.
    fn arch_keys(&mut self, arch: Arch) {
        let text_models = "to the text models bag, lstm and transformer";
        if !arch.is_text() {
            self.only_for("model.embed_dim", text_models);
        }
        if arch != Arch::Lstm {
            self.only_for("model.hidden_size", "to lstm");
        }
        if !matches!(arch, Arch::Lstm | Arch::Transformer) {
            self.only_for("model.layers", "to lstm and transformer");
        }
        if arch != Arch::Transformer {
            for k in ["model.heads", "model.ff_dim", "model.dropout"] {
                self.only_for(k, "to transformer");
            }
        }
        if !arch.is_resnet() {
            self.only_for("model.stem", "to resnet18, resnet34 and resnet50");
        }
        if arch != Arch::SmallCnn {
            self.only_for("model.width", "to small_cnn");
        }
        if !matches!(arch, Arch::Mlp | Arch::Bag) {
            self.only_for("model.hidden", "to mlp and bag");
        }
    }

    /// Text models on text, image models on images big enough for them, and the class
    /// count against the data's. Returns the class count.
    fn model_fits_data(&mut self, arch: Arch, data: &DataPlan) -> usize {
        let m = &self.recipe().model;
        match (arch.is_text(), data.text().is_some()) {
            (true, false) => self.err(
                "model.arch",
                format!(
                    "{} reads token sequences, but the data are images",
                    arch.name()
                ),
                "use data.format = \"jsonl\", or an image model (small_cnn, resnet18, ...)",
            ),
            (false, true) => self.err(
                "model.arch",
                format!("{} reads images, but the data are text", arch.name()),
                "use bag, lstm or transformer for text",
            ),
            _ => {}
        }
        let num_classes = m.num_classes.unwrap_or(data.classes);
        if num_classes > crate::data::MAX_CLASSES {
            self.err(
                "model.num_classes",
                format!(
                    "{num_classes} classes, over the cap of {}",
                    crate::data::MAX_CLASSES
                ),
                "each class is a row of the last layer; remove the key to use the data's classes",
            );
        } else if num_classes < 2 && m.num_classes.is_none() {
            // The count came from the data: its class names (it was blamed on a key the
            // recipe never set).
            self.err(
                "data.train",
                format!(
                    "its class names (batches.meta.txt beside it) name {num_classes} class{}: too few for a classifier",
                    if num_classes == 1 { "" } else { "es" }
                ),
                "name at least 2 classes there, one per line (line k names label k - 1)",
            );
        } else if num_classes < 2 {
            self.err(
                "model.num_classes",
                format!(
                    "{num_classes} class{}: too few",
                    if num_classes == 1 { "" } else { "es" }
                ),
                "a classifier needs at least 2",
            );
        } else if num_classes < data.classes {
            self.err(
                "model.num_classes",
                format!(
                    "{num_classes} is fewer than the {} classes the data has",
                    data.classes
                ),
                format!("remove the key to use {}", data.classes),
            );
        }
        if arch.is_resnet()
            && m.stem != Some(Stem::Imagenet)
            && data.image().is_some_and(|i| i.height < 8)
        {
            self.err(
                "model.arch",
                "images are too small for a ResNet",
                "use small_cnn or mlp",
            );
        }
        if arch == Arch::SmallCnn && data.image().is_some_and(|i| i.height < 4) {
            self.err(
                "model.arch",
                "images are too small for small_cnn (two 2×2 pools)",
                "use mlp",
            );
        }
        num_classes
    }
}

/// The head count nearest `heads` that divides `embed_dim` (the smaller of two as near):
/// what the help of a count that does not divide suggests.
fn dividing_heads(embed_dim: usize, heads: usize) -> usize {
    (1..=embed_dim.min(256))
        .filter(|d| embed_dim.is_multiple_of(*d))
        .min_by_key(|d| (d.abs_diff(heads), *d))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::dividing_heads;

    #[test]
    fn the_suggested_head_count_divides_the_width() {
        assert_eq!(dividing_heads(64, 5), 4);
        assert_eq!(dividing_heads(96, 5), 4);
        assert_eq!(dividing_heads(96, 7), 6);
        assert_eq!(dividing_heads(7, 3), 1);
        assert_eq!(dividing_heads(1000, 300), 250);
    }
}
