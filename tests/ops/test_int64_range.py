"""int64 tensors are held in int32 on the device (runtime/dtypes.py). Where an int64
result can leave the int32 range (add / sub / mul, cumsum, float -> int64 casts), the
shader checks it (int_checked.h): in range, the values equal eager's exactly; past it,
the call raises VkDelegateError naming the node, never a silently wrapped number
(a new-user trial hashed ids with ``(ids * 1_000_003) % 1000`` and got wrong buckets).
int32 results still wrap, as ATen's do, and an int -> float64 cast stays on the CPU."""
import pytest
import torch
from torch import nn

from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.errors import VkDelegateError

pytestmark = pytest.mark.skipif(bool(vulkan_unavailable()), reason=str(vulkan_unavailable()))

BIG = 2 ** 31


def _lower(module, *args):
    program = to_backend(torch.export.export(module, args), VulkanPartitioner())
    assert "0 on CPU" in str(program.report).splitlines()[0], program.report
    return program


class Arith(nn.Module):
    def forward(self, a, b):
        return (a + b, a - b, a * b, torch.add(a, b, alpha=3), a * 7, a - 5,
                torch.sub(a, b, alpha=-2))


@pytest.mark.parametrize("a,b", [
    ([BIG - 9, -BIG + 9, 46340, -46341, 0, 1], [3, -3, 46340, 46340, -BIG, BIG - 1]),
    ([12, -7, 1000, 3, 0, -1], [5, 5, -1000, 3, 17, 1]),
])
def test_in_range_results_equal_eager(a, b):
    a, b = torch.tensor(a), torch.tensor(b)
    ours = Arith()
    program = _lower(ours, a, b)
    # only the results that stay in int32 are compared: pick the pairs where they all do
    expected = ours(a, b)
    fits = torch.stack([(e >= -BIG) & (e < BIG) for e in expected]).all(0)
    a, b = torch.where(fits, a, 1), torch.where(fits, b, 1)
    for got, want in zip(program(a, b), ours(a, b)):
        assert got.dtype == torch.int64
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("a,b,op", [
    ([BIG - 9, 0], [10, 0], "aten.add.Tensor"),         # a + b past 2**31 - 1
    ([-BIG + 1, 0], [5, 0], "aten.sub.Tensor"),         # a - b below -2**31
    ([46341, 0], [46341, 0], "aten.mul.Tensor"),        # 46341**2 > 2**31
    ([-BIG, 0], [-1, 0], "aten.mul.Tensor"),            # -(-2**31)
])
def test_results_past_int32_raise_naming_the_node(a, b, op):
    class One(nn.Module):
        def forward(self, x, y):
            return {"aten.add.Tensor": torch.add, "aten.sub.Tensor": torch.sub,
                    "aten.mul.Tensor": torch.mul}[op](x, y)
    ok = torch.tensor([3, 4]), torch.tensor([5, 6])
    program = _lower(One(), *ok)
    torch.testing.assert_close(program(*ok), One()(*ok))
    with pytest.raises(VkDelegateError, match=rf"node \d+ \({op}\): an int64 result "
                                              rf"outside the int32 range"):
        program(torch.tensor(a), torch.tensor(b))
    # the program still runs after the error
    torch.testing.assert_close(program(*ok), One()(*ok))


def test_hash_bucket_raises_instead_of_wrong_buckets():
    class Bucket(nn.Module):
        def forward(self, ids):
            return (ids * 1_000_003) % 1000
    small = torch.tensor([5, 7, 11, 2000])
    program = _lower(Bucket(), small)
    torch.testing.assert_close(program(small), Bucket()(small), rtol=0, atol=0)
    with pytest.raises(VkDelegateError, match=r"aten.mul.Tensor"):
        program(torch.tensor([5, 7000, 123456, 2_000_000]))


def test_broadcast_and_scalar_forms_are_checked():
    class Mixed(nn.Module):
        def forward(self, a, b):
            return a * b + 1, a * 65536
    a, b = torch.tensor([[1], [2], [3]]), torch.tensor([10, -20])
    program = _lower(Mixed(), a, b)
    for got, want in zip(program(a, b), Mixed()(a, b)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(VkDelegateError, match="aten.mul"):
        program(torch.tensor([[1], [2], [40000]]), b)  # 40000 * 65536 > 2**31


def test_int32_results_wrap_as_eager():
    class Wrap(nn.Module):
        def forward(self, a, b):
            return a * b, a + b
    a = torch.tensor([BIG - 1, 46341], dtype=torch.int32)
    b = torch.tensor([1, 46341], dtype=torch.int32)
    program = _lower(Wrap(), a, b)
    for got, want in zip(program(a, b), Wrap()(a, b)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_cumsum_int64_checked():
    class Cum(nn.Module):
        def forward(self, x, mask):
            return torch.cumsum(x, 0), torch.cumsum(mask, 1) - 1
    x, mask = torch.tensor([BIG // 2, -5, BIG // 2 - 7]), torch.tensor([[1, 1, 0, 1]])
    program = _lower(Cum(), x, mask)
    for got, want in zip(program(x, mask), Cum()(x, mask)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(VkDelegateError, match=r"aten.cumsum.default\): an int64 result"):
        program(torch.tensor([BIG // 2, BIG // 2, 5]), mask)


def test_float_to_int64_cast_checked():
    class Cast(nn.Module):
        def forward(self, x):
            return x.long(), x.int()
    ok = torch.tensor([2.0e9, -2147483648.0, -1.5, 7.9])
    program = _lower(Cast(), ok)
    for got, want in zip(program(ok), Cast()(ok)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for bad in ([3e9, 0.0, 0.0, 0.0], [-2147483904.0, 0.0, 0.0, 0.0]):
        with pytest.raises(VkDelegateError, match=r"aten._to_copy.default\)"):
            program(torch.tensor(bad))
    # NaN and infinities are not refused: ATen's cast leaves them undefined, and models
    # select such values away (T5 casts log(0) = -inf to long under a torch.where)
    got = program(torch.tensor([float("nan"), float("-inf"), float("inf"), 7.5]))
    assert got[0][3] == 7 and got[1][3] == 7


def test_int_to_float64_stays_on_the_cpu():
    class Wide(nn.Module):
        def forward(self, ids):
            return ids.to(torch.float64) + 0.5
    ids = torch.tensor([16777217, 123456789])
    program = to_backend(torch.export.export(Wide(), (ids,)), VulkanPartitioner())
    assert "int64 to float64: the device holds float64 in float32" in str(program.report)
    torch.testing.assert_close(program(ids), Wide()(ids), rtol=0, atol=0)


def test_float64_to_integer_and_bool_stays_on_the_cpu():
    """The device would round a float64 value to float32 before the cast: 2.9999999999
    would truncate to 3 where ATen gives 2, and 1e-50 would be False. float64 -> float32
    rounds as ATen does and stays delegated."""
    class Casts(nn.Module):
        def forward(self, x):
            return x.long(), x.to(torch.int32), x.bool(), x.to(torch.uint8), x.float()
    x = torch.tensor([2.9999999999, -2.9999999999, 16777217.0, 0.99999999999, 1e-50],
                     dtype=torch.float64)
    program = to_backend(torch.export.export(Casts(), (x,)), VulkanPartitioner())
    report = str(program.report)
    for out in ("int64", "int32", "bool", "uint8"):
        assert f"float64 to {out}: the device holds float64 in float32" in report
    cpu = [d.op for d in program.report.cpu_nodes]
    assert cpu == ["aten._to_copy.default"] * 4  # the float32 cast is delegated
    for got, want in zip(program(x), Casts()(x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_negation_and_division_of_int32_min_are_checked():
    """-2^31 held as int64: its negation, abs and // -1 are 2^31 in eager; refused."""
    class Signs(nn.Module):
        def forward(self, x):
            return -x, x.abs()

    class Divide(nn.Module):
        def forward(self, x, d):
            return (torch.div(x, d, rounding_mode="floor"),
                    torch.div(x, d, rounding_mode="trunc"))
    x, d = torch.tensor([-BIG + 1, 5, -7]), torch.tensor([-1, 2, -3])
    signs, divide = _lower(Signs(), x), _lower(Divide(), x, d)
    for got, want in zip(signs(x) + divide(x, d), Signs()(x) + Divide()(x, d)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(VkDelegateError, match=r"aten\.neg\.default\): an int64 result"):
        signs(torch.tensor([-BIG, 5, -7]))
    with pytest.raises(VkDelegateError, match=r"aten\.div\.Tensor_mode\): an int64 result"):
        divide(torch.tensor([0, -BIG, 4]), torch.tensor([1, -1, 3]))
    torch.testing.assert_close(divide(torch.tensor([0, -BIG, 4]), torch.tensor([1, 2, 3])),
                               Divide()(torch.tensor([0, -BIG, 4]), torch.tensor([1, 2, 3])))


class Divisions(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, a, b):
        return self.op(a, b) + 0 * a


DIVISIONS = {
    "floor_divide": lambda a, b: a // b,
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": lambda a, b: a % b,
    "fmod": lambda a, b: torch.fmod(a, b),
}


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("name", sorted(DIVISIONS))
def test_integer_division_by_zero_raises_as_in_eager(dtype, name):
    """ATen raises ZeroDivisionError for an integer division, remainder or fmod by zero;
    the shader's value was 0 (or the dividend): now the run raises, naming the node.
    Nonzero divisors give eager's values exactly, negatives included."""
    op = DIVISIONS[name]
    a = torch.tensor([7, -7, 5, 0, 100], dtype=dtype)
    b = torch.tensor([2, 2, -3, 1, 7], dtype=dtype)
    model = Divisions(op)
    program = _lower(model, a, b)
    torch.testing.assert_close(program(a, b), model(a, b), rtol=0, atol=0)
    zero = torch.tensor([2, 0, 1, 1, 1], dtype=dtype)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        model(a, zero)
    with pytest.raises(VkDelegateError, match=r"\): ZeroDivisionError: integer division or "
                                              r"remainder by zero \(as in eager\)"):
        program(a, zero)
    torch.testing.assert_close(program(a, b), model(a, b), rtol=0, atol=0)  # flags reset
