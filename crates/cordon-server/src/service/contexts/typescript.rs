//! TypeScript cells (ADR 0043): a TypeScript context is a JavaScript context whose cells
//! are turned into JavaScript here, on the host, before its driver (`driver.js`) gets them.
//! oxc parses the cell as TypeScript (a script, or a module when it has `import`, `export`
//! or top-level `await`), checks it, strips its types and lowers what TypeScript adds to
//! JavaScript (enums, namespaces, parameter properties), and prints JavaScript that the
//! driver runs as it runs a JavaScript cell: ESM imports, top-level `await`, the last
//! expression as the cell's value and the state kept for the next cell all work the same.
//! A cell oxc refuses never reaches the interpreter: its first error is the cell's
//! `SyntaxError`, with the line and column in the traceback.

use std::path::Path;

use oxc_allocator::Allocator;
use oxc_ast::ast::Statement;
use oxc_codegen::Codegen;
use oxc_diagnostics::{OxcDiagnostic, Severity};
use oxc_parser::Parser;
use oxc_semantic::SemanticBuilder;
use oxc_span::SourceType;
use oxc_transformer::{TransformOptions, Transformer, TypeScriptOptions};

use crate::model::CellError;

/// The name a cell's position is given under in its error, as the driver names a
/// JavaScript cell `<cell N>`.
const CELL_NAME: &str = "<typescript cell>";

/// The JavaScript for TypeScript cell `source`, or the error that stops it.
pub(super) fn to_javascript(source: &str) -> Result<String, CellError> {
    let alloc = Allocator::default();
    let parsed = Parser::new(&alloc, source, SourceType::ts()).parse();
    refuse(source, &parsed.diagnostics)?;
    if parsed.panicked {
        return Err(error_at(
            source,
            0,
            "the cell could not be parsed as TypeScript",
            0,
        ));
    }
    let mut program = parsed.program;
    let checked = SemanticBuilder::new_compiler()
        .with_enum_eval(true)
        .build(&program);
    refuse(source, &checked.diagnostics)?;
    let options = TransformOptions {
        typescript: TypeScriptOptions {
            // An import the cell does not use may be for the cells after it: only
            // `import type` (and `type` specifiers) go.
            only_remove_type_imports: true,
            ..TypeScriptOptions::default()
        },
        ..TransformOptions::default()
    };
    let done = Transformer::new(&alloc, Path::new("cell.ts"), &options)
        .build_with_scoping(checked.semantic.into_scoping(), &mut program);
    refuse(source, &done.diagnostics)?;
    // A module whose imports were all types gets an `export {}` to stay a module; the
    // driver runs a cell as a script or as an async function, where it cannot stand.
    program
        .body
        .retain(|s| !matches!(s, Statement::ExportNamedDeclaration(e) if e.specifiers.is_empty()));
    Ok(Codegen::new().build(&program).code)
}

/// The first error among `diagnostics` (warnings pass), as the cell's error.
fn refuse<'d>(
    source: &str,
    diagnostics: impl IntoIterator<Item = &'d OxcDiagnostic>,
) -> Result<(), CellError> {
    let errors: Vec<&OxcDiagnostic> = diagnostics
        .into_iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    let Some(first) = errors.first() else {
        return Ok(());
    };
    let label = first
        .labels
        .iter()
        .find(|l| l.primary())
        .or_else(|| first.labels.first());
    let offset = label.map_or(0, |l| l.offset() as usize);
    let width = label.map_or(0, |l| l.len() as usize);
    let mut e = error_at(source, offset, &first.message, width);
    if let Some(help) = &first.help {
        e.traceback.push_str(&format!("\n{help}"));
    }
    if errors.len() > 1 {
        e.traceback.push_str(&format!(
            "\n({} more errors after this one)",
            errors.len() - 1
        ));
    }
    Err(e)
}

/// A `SyntaxError` at byte `offset` of `source`: the traceback names the line and column
/// (1-based, in characters), shows the line and marks `width` bytes of it, as Node shows a
/// JavaScript cell's syntax error.
fn error_at(source: &str, offset: usize, message: &str, width: usize) -> CellError {
    let offset = floor_char(source, offset.min(source.len()));
    let start = source[..offset].rfind('\n').map_or(0, |i| i + 1);
    let end = source[offset..]
        .find('\n')
        .map_or(source.len(), |i| offset + i);
    let line_no = source[..offset].matches('\n').count() + 1;
    let col = source[start..offset].chars().count() + 1;
    let line = source[start..end].trim_end_matches('\r');
    let marked = floor_char(source, (offset + width).min(end));
    let carets = source[offset..marked].chars().count().max(1);
    CellError {
        name: "SyntaxError".into(),
        value: message.to_string(),
        traceback: format!(
            "{CELL_NAME}:{line_no}:{col}\n{line}\n{}{}\n\nSyntaxError: {message}",
            " ".repeat(col - 1),
            "^".repeat(carets)
        ),
    }
}

/// `i`, moved back to the start of the character it falls in.
fn floor_char(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn js(ts: &str) -> String {
        match to_javascript(ts) {
            Ok(js) => js,
            Err(e) => panic!("{ts:?} refused: {e:?}"),
        }
    }

    #[test]
    fn types_interfaces_and_generics_go_and_the_code_stays() {
        let out = js("interface P { x: number }\n\
             function first<T>(xs: T[]): T { return xs[0]; }\n\
             const p: P = { x: first<number>([41]) + 1 };\n\
             console.log(p.x as number);");
        assert!(!out.contains("interface"), "{out}");
        assert!(!out.contains(": number"), "{out}");
        assert!(!out.contains("<T>"), "{out}");
        assert!(out.contains("function first(xs)"), "{out}");
        assert!(out.contains("console.log(p.x)"), "{out}");
    }

    #[test]
    fn the_last_expression_stays_the_last_statement() {
        assert_eq!(js("process.cwd()").trim(), "process.cwd();");
    }

    #[test]
    fn enums_and_parameter_properties_become_javascript() {
        let out = js("enum Color { Red, Green = 5 }\n\
             class A { constructor(private n: number) {} }");
        assert!(out.contains("Color[Color[\"Green\"] = 5]"), "{out}");
        assert!(out.contains("this.n = n"), "{out}");
    }

    #[test]
    fn imports_stay_for_later_cells_but_type_imports_go() {
        let out = js("import fs from 'node:fs';\n\
             import type { Stats } from 'node:fs';\n\
             import { type Dirent, readdirSync } from 'node:fs';\n\
             const n: number = await Promise.resolve(1);");
        assert!(out.contains("import fs from \"node:fs\""), "{out}");
        assert!(
            out.contains("import { readdirSync } from \"node:fs\""),
            "{out}"
        );
        assert!(!out.contains("Stats") && !out.contains("Dirent"), "{out}");
        assert!(out.contains("await Promise.resolve(1)"), "{out}");
        assert!(!out.contains("export"), "{out}");
    }

    #[test]
    fn a_cell_of_types_only_is_empty() {
        assert_eq!(js("type A = { a: string };\ninterface B {}").trim(), "");
        assert_eq!(js("import type { A } from './a';").trim(), "");
        let out = js("import type { A } from './a';\nconst a: A = await Promise.resolve(1);");
        assert!(!out.contains("export"), "{out}");
    }

    #[test]
    fn a_script_cell_stays_a_script() {
        // Not a module (no import, export or top-level await): sloppy-mode JavaScript such
        // as a bare assignment to an undeclared name runs as the cell wrote it.
        let out = js("undeclared = 1 as number; var again: string = 'a'; var again = 'b';");
        assert!(out.contains("undeclared = 1;"), "{out}");
        assert!(!out.contains("export"), "{out}");
    }

    #[test]
    fn a_syntax_error_names_its_line_and_column() {
        let e = to_javascript("const a = 1;\nlet b: = 2;").expect_err("refused");
        assert_eq!(e.name, "SyntaxError");
        assert!(!e.value.is_empty());
        assert!(
            e.traceback
                .starts_with("<typescript cell>:2:8\nlet b: = 2;\n       ^"),
            "{}",
            e.traceback
        );
        assert!(e.traceback.contains(&format!("SyntaxError: {}", e.value)));
    }

    #[test]
    fn a_checked_error_is_refused_too() {
        let e = to_javascript("let x: number = 1;\nlet x = 2;").expect_err("refused");
        assert_eq!(e.name, "SyntaxError");
        assert!(e.value.contains('x'), "{e:?}");
        assert!(e.traceback.starts_with("<typescript cell>:"), "{e:?}");
    }

    /// Pieces of TypeScript (and of nonsense) a tenant's cell may hold, in any order.
    const PIECES: &[&str] = &[
        "let ",
        "const ",
        "x",
        ": ",
        "number",
        "<T>",
        "<",
        ">",
        "(",
        ")",
        "{",
        "}",
        "[",
        "]",
        "=>",
        "=",
        ";",
        "\n",
        ",",
        "interface ",
        "type ",
        "enum ",
        "namespace ",
        "class ",
        "implements ",
        "extends ",
        "import ",
        "export ",
        "from ",
        "'m'",
        "await ",
        "async ",
        "function ",
        "return ",
        "as ",
        "satisfies ",
        "?",
        "!",
        "@",
        "`${",
        "`",
        "/*",
        "*/",
        "//",
        "declare ",
        "abstract ",
        "private ",
        "readonly ",
        "keyof ",
        "typeof ",
        "infer ",
        "is ",
        "asserts ",
        "unique symbol",
        "|",
        "&",
        ".",
        "...",
        "1",
        "0x",
        "é",
        "\u{0}",
        "#p",
        "static ",
        "constructor",
        "get ",
        "set ",
        "new ",
        "this",
        "super",
        "yield ",
        "*",
        "module ",
        "global ",
        "require",
        "accessor ",
        "using ",
        "out ",
        "in ",
        "const",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2048))]

        /// Whatever a cell holds, oxc answers JavaScript or an error: it never panics
        /// (a panic would end the server, which aborts on panic in release builds).
        #[test]
        fn any_cell_is_translated_or_refused_never_a_panic(
            pieces in proptest::collection::vec(proptest::sample::select(PIECES), 0..40)
        ) {
            let cell = pieces.concat();
            if let Err(e) = to_javascript(&cell) {
                proptest::prop_assert_eq!(e.name, "SyntaxError");
                proptest::prop_assert!(e.traceback.starts_with("<typescript cell>:"));
            }
        }
    }

    #[test]
    fn positions_count_characters_and_never_split_one() {
        let e = error_at("é = ü:", 5, "bad", 99);
        assert!(
            e.traceback
                .starts_with("<typescript cell>:1:5\né = ü:\n    ^^"),
            "{e:?}"
        );
        let e = error_at("", 7, "empty", 0);
        assert!(
            e.traceback.starts_with("<typescript cell>:1:1\n\n^\n"),
            "{e:?}"
        );
    }
}
