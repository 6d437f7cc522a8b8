use super::*;

fn place(rank: usize, node_sizes: Vec<usize>) -> WorkerPlace {
    let mut p = WorkerPlace::single_node(rank, node_sizes.iter().sum());
    p.node_sizes = node_sizes;
    p.node_rank = p.node_of(rank).unwrap();
    p.local_rank = rank - p.node_ranks(p.node_rank).start;
    p
}

#[test]
fn layouts_put_tensor_parallel_groups_inside_nodes() {
    // 2 nodes of 4: TP 2 -> groups {0,1} {2,3} {4,5} {6,7}; DP by place in the group.
    let l = Layout::new(&place(5, vec![4, 4]), 2).unwrap();
    assert_eq!(l.tp, [4, 5]);
    assert_eq!(l.dp, [1, 3, 5, 7]);
    assert_eq!(l.describe(), "TP 2 x DP 4");
    // TP 0: the whole node.
    let l = Layout::new(&place(6, vec![4, 4]), 0).unwrap();
    assert_eq!((l.tp, l.dp), (vec![4, 5, 6, 7], vec![2, 6]));
    assert!(Layout::new(&place(0, vec![3, 3]), 2).is_err());
    let l = Layout::data_parallel(&place(1, vec![2]));
    assert_eq!((l.tp, l.dp), (vec![1], vec![0, 1]));
}

#[test]
fn peak_table() {
    assert_eq!(peak_bf16_tflops("NVIDIA H200"), Some(989.0));
    assert_eq!(peak_bf16_tflops("NVIDIA H100 PCIe"), Some(756.0));
    assert_eq!(peak_bf16_tflops("Intel Xeon"), None);
}
