fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let device = if thrust_native_probe::wants_cuda(&args) { "cuda" } else { "cpu" };
    println!("train_probe device={device} args={}", args.join(" "));
}
