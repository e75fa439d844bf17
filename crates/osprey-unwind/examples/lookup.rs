//! Prints the rule at each address of an ELF file:
//! `cargo run -p osprey-unwind --example lookup -- FILE 0x1234 ...`
fn main() -> Result<(), osprey_unwind::Error> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_default();
    let c = osprey_unwind::compile::compile_file(path.as_ref(), None)?;
    println!("{} FDEs, {} entries", c.eh_fdes, c.table.len());
    for a in args {
        let a = u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap_or(0);
        println!("{a:#x}: {:?}", c.table.lookup(a));
    }
    Ok(())
}
