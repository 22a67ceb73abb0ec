"""Which call created each autograd node: sequence-number marks and the owner of each leaf."""

from __future__ import annotations

import torch

from modelprof.step.autograd_scope import LOSS, SeqMarks, graph_nodes, is_accumulate, tag_graph


def test_marks_give_each_node_the_call_running_when_it_was_made():
    marks = SeqMarks(before=7)
    w = torch.randn(3, requires_grad=True)
    early = w * 2  # made before any mark: the ``before`` call
    marks.mark(0)
    a = early + 1  # call 0
    marks.mark(1)
    marks.mark(2)  # no node in between: the same span, now call 2
    b = a.exp()  # call 2
    marks.mark(LOSS)
    loss = b.sum()  # the loss
    tags = tag_graph([loss.grad_fn], marks)
    assert tags.call_of(early.grad_fn) == 7
    assert tags.call_of(a.grad_fn) == 0
    assert tags.call_of(b.grad_fn) == 2
    assert tags.call_of(loss.grad_fn) == LOSS
    assert marks.seqs == sorted(marks.seqs) and len(marks.seqs) == 3  # 0, (1 ->) 2, LOSS


def test_a_leaf_belongs_to_the_first_call_that_used_it():
    marks = SeqMarks()
    w = torch.randn(4, requires_grad=True)
    marks.mark(5)
    first = w * 3  # call 5 uses w first ...
    marks.mark(2)
    second = w + first  # ... call 2 (a lower index: a parent's own op) uses it after
    tags = tag_graph([second.sum().grad_fn], marks)
    leaves = [n for n in tags.nodes if is_accumulate(n)]
    assert len(leaves) == 1 and leaves[0].variable is w
    assert tags.call_of(leaves[0]) == 5


def test_graph_nodes_visits_each_node_once():
    x = torch.randn(2, requires_grad=True)
    y = x * x  # two edges into x's AccumulateGrad
    z = (y + y).sum()
    nodes = graph_nodes([z.grad_fn])
    # SumBackward, AddBackward, MulBackward, AccumulateGrad
    assert [type(n).__name__ for n in nodes].count("AccumulateGrad") == 1
    assert len(nodes) == len(set(nodes)) == 4
