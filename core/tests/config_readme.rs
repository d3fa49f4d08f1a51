//! README's variable table is the configuration table (`ibnet_core::config`) rendered: every
//! variable declared there appears in README with the same default, "since" and doc line, and
//! README lists no variable the table lacks. On a mismatch the test prints the expected text
//! (paste it between the markers, or edit the table). `IBNET_README_BLESS=1 cargo test -p
//! ibnet-core --test config_readme` writes the rendered table into README.md instead.

use ibnet_core::config::{self, readme};

fn readme_section() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    let text = std::fs::read_to_string(path).expect("README.md");
    let (_, rest) = text
        .split_once(&format!("{}\n", readme::BEGIN))
        .expect("README has the BEGIN marker");
    let (table, _) = rest
        .split_once(readme::END)
        .expect("README has the END marker");
    table.to_string()
}

#[test]
fn readme_variable_table_is_the_configuration_table() {
    let want = readme::Table.to_string();
    let got = readme_section();
    if got != want && std::env::var_os("IBNET_README_BLESS").is_some() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
        let text = std::fs::read_to_string(path).expect("README.md");
        let blessed = text.replacen(
            &format!("{}\n{got}{}", readme::BEGIN, readme::END),
            &format!("{}\n{want}{}", readme::BEGIN, readme::END),
            1,
        );
        assert_ne!(blessed, text, "README's table section not found whole");
        std::fs::write(path, blessed).expect("write README.md");
        return;
    }
    if got != want {
        let diff: Vec<String> = got
            .lines()
            .zip(want.lines())
            .filter(|(g, w)| g != w)
            .take(5)
            .map(|(g, w)| format!("README: {g}\ntable:  {w}"))
            .collect();
        panic!(
            "README.md's variable table differs from core/src/config (first differences below; \
             {} README lines, {} table lines). Expected text:\n{want}\n{}",
            got.lines().count(),
            want.lines().count(),
            diff.join("\n")
        );
    }
}

#[test]
fn every_variable_readme_names_in_its_table_is_declared_and_vice_versa() {
    let section = readme_section();
    let named: Vec<&str> = section
        .lines()
        .skip(2)
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .collect();
    for n in &named {
        assert!(
            config::find(n).is_some(),
            "README lists {n}, the table does not"
        );
    }
    for v in config::all() {
        let row = section
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", v.name)))
            .unwrap_or_else(|| panic!("{} is not in README", v.name));
        let cells: Vec<&str> = row.split(" | ").collect();
        assert_eq!(cells[1], v.since.to_string(), "{}: since", v.name);
        let d = match v.shown_default() {
            "" => "(unset)",
            d => d,
        };
        assert_eq!(cells[2], d, "{}: default", v.name);
    }
}
