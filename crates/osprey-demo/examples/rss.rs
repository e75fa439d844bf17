fn rss() -> String {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().filter(|l| l.starts_with("VmRSS") || l.starts_with("VmHWM")).collect::<Vec<_>>().join(" ")
}
fn main() {
    eprintln!("start      {}", rss());
    let p = osprey::Profiler::builder().hz(1000).out_dir("/tmp/osprey-rss").start().unwrap();
    eprintln!("started    {}", rss());
    osprey_demo::on_threads(2, || { osprey_demo::split_work(300); });
    eprintln!("worked     {}", rss());
    p.flush().unwrap();
    eprintln!("flushed    {}", rss());
    osprey_demo::on_threads(2, || { osprey_demo::split_work(300); });
    p.flush().unwrap();
    eprintln!("flushed2   {}", rss());
    drop(p);
    eprintln!("stopped    {}", rss());
}
