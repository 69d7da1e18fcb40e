//! Prints the `WorkerPool` CRD (`crds/workerpool.yaml` holds its output).

fn main() {
    print!("{}", mango_controller::kubernetes::crd::crd_yaml());
}
