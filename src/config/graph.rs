//! The processor graph: topological order, and the route that closes a cycle.

use sluice_core::pipeline::wiring::RouteSpec;

/// The processors in topological order (each after every processor that routes to it), or the
/// route that closes a cycle with the processors on it (the first one again at the end).
pub(super) fn processor_graph(
    routes: &[RouteSpec],
    n_sources: usize,
    n_sinks: usize,
    n: usize,
) -> Result<Vec<usize>, (usize, Vec<usize>)> {
    // edges[p] = (q, route index)
    let mut edges: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n];
    for (i, r) in routes.iter().enumerate() {
        for p in r.from.iter().filter_map(|&f| f.checked_sub(n_sources)) {
            for q in r.to.iter().filter_map(|&t| t.checked_sub(n_sinks)) {
                if p < n && q < n {
                    edges[p].push((q, i));
                }
            }
        }
    }
    // Depth-first: 0 unvisited, 1 on the stack, 2 done. A back edge closes a cycle.
    fn visit(
        p: usize,
        edges: &[Vec<(usize, usize)>],
        state: &mut [u8],
        stack: &mut Vec<usize>,
        post: &mut Vec<usize>,
    ) -> Result<(), (usize, Vec<usize>)> {
        state[p] = 1;
        stack.push(p);
        for &(q, route) in &edges[p] {
            match state[q] {
                0 => visit(q, edges, state, stack, post)?,
                1 => {
                    let from = stack.iter().position(|&x| x == q).unwrap_or(0);
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(q);
                    return Err((route, cycle));
                }
                _ => {}
            }
        }
        stack.pop();
        state[p] = 2;
        post.push(p);
        Ok(())
    }
    let mut state = vec![0u8; n];
    let mut post = Vec::with_capacity(n);
    for p in 0..n {
        if state[p] == 0 {
            visit(p, &edges, &mut state, &mut Vec::new(), &mut post)?;
        }
    }
    post.reverse();
    Ok(post)
}
