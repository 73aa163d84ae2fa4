"""Java chunks, anchors and cross-file resolution against hand-checked fixtures."""

from codekv.defuse.graph import ModuleResolver
from codekv.index import Index
from codekv.tokens import CounterSpec

SOURCE = """\
package shop.cart;

import java.util.List;
import static shop.util.Money.round;
import shop.model.*;

/** A cart of items. */
@Entity
public class Cart extends Base implements Iterable<Item> {
    private List<Item> items;
    static final int LIMIT = 10;

    public Cart(List<Item> items) {
        this.items = items;
    }

    double total(Discount d) throws PriceException {
        double sum = 0;
        for (Item item : items) {
            sum += item.price();
        }
        if (sum > LIMIT) {
            sum = d.apply(sum);
        } else {
            log("small");
        }
        try {
            return round(sum);
        } catch (ArithmeticException e) {
            throw new PriceException(e);
        } finally {
            items = null;
        }
    }

    String label(int n) {
        switch (n) {
            case 0:
                return "empty";
            default:
                return n > 1 ? "items" : "item";
        }
    }
}
"""


def _found(chunk, kind):
    source = SOURCE.encode()
    return [source[a.start_byte : a.end_byte].decode() for a in chunk.anchors if a.kind == kind]


def test_small_class_is_one_chunk(analyze):
    result = analyze("java", SOURCE, budget=2000)
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [("module", None, 1, 5), ("class", "Cart", 7, 44)]
    # The Javadoc and the annotation travel with the class.
    assert result.chunks[1].text(SOURCE.encode()).startswith(b"/** A cart of items. */\n@Entity")


def test_oversized_class_splits_into_header_and_methods(analyze):
    result = analyze("java", SOURCE, budget=512)
    shape = [(c.kind, c.qualname, c.parent, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("module", None, None, 1, 5),
        ("class", "Cart", None, 7, 11),  # signature and fields
        ("method", "Cart.Cart", "Cart", 13, 15),
        ("method", "Cart.total", "Cart", 17, 34),
        ("method", "Cart.label", "Cart", 36, 43),
    ]


def test_anchors_by_kind(analyze):
    module, cart, constructor, total, label = analyze("java", SOURCE, budget=512).chunks
    assert _found(module, "import") == [
        "import java.util.List;",
        "import static shop.util.Money.round;",
        "import shop.model.*;",
    ]
    assert [a.name for a in module.anchors] == ["List", "round", "*"]
    assert _found(cart, "def") == ["Cart", "items", "LIMIT"]
    assert _found(constructor, "assign") == ["items"]
    assert _found(total, "def") == ["total"]
    assert _found(total, "call") == [
        "item.price()", "d.apply(sum)", 'log("small")', "round(sum)", "new PriceException(e)",
    ]
    assert [a.name for a in total.anchors if a.kind == "call"] == [
        "price", "apply", "log", "round", "PriceException",
    ]
    assert _found(total, "assign") == ["sum", "sum", "sum", "items"]
    branches = [a.name for a in total.anchors if a.kind == "branch"]
    assert branches == [
        "enhanced_for_statement", "if_statement", "block", "try_statement", "catch_clause",
        "finally_clause",
    ]
    assert _found(total, "branch")[2] == '{\n            log("small");\n        }'  # the else
    assert _found(total, "return") == ["return round(sum);", "throw new PriceException(e);"]
    assert [a.name for a in label.anchors if a.kind == "branch"] == [
        "switch_expression", "switch_block_statement_group", "switch_block_statement_group",
        "ternary_expression",
    ]
    assert _found(label, "branch")[1] == 'case 0:\n                return "empty";'
    assert _found(label, "return") == ['return "empty";', 'return n > 1 ? "items" : "item";']


def test_definitions_references_and_imports(analyze):
    result = analyze("java", SOURCE)
    assert {(d.name, d.kind) for d in result.definitions} == {
        ("Cart", "class"),
        ("items", "field"),
        ("LIMIT", "field"),
        ("total", "method"),
        ("label", "method"),
    }
    refs = [(r.name, r.kind) for r in result.references]
    assert ("Entity", "annotation") in refs
    assert ("Base", "inherit") in refs and ("Iterable", "inherit") in refs
    # The constructor refers to its class rather than redefining the name.
    assert ("Cart", "constructor") in refs
    assert {("Discount", "type"), ("PriceException", "type"), ("ArithmeticException", "type"),
            ("String", "type"), ("List", "type")} <= set(refs)
    assert refs.count(("Item", "type")) == 4  # Iterable<Item>, two List<Item>, the loop
    assert ("PriceException", "call") in refs  # `new PriceException(e)`, once as a call
    assert refs.count(("PriceException", "call")) == 1
    assert [(i.module, i.name, i.alias) for i in result.imports] == [
        ("java.util", "List", None),
        ("shop.util.Money", "round", None),
        ("shop.model", "*", None),
    ]


def test_enum_and_interface_members_split(analyze):
    source = (
        "enum Op {\n"
        "    ADD, SUB;\n"
        "\n"
        "    int apply(int a, int b) {\n"
        "        return this == ADD ? a + b : a - b;\n"
        "    }\n"
        "}\n"
        "interface Shape extends Named<String> {\n"
        "    double area();\n"
        "}\n"
    )
    result = analyze("java", source, budget=80)
    shape = [(c.kind, c.qualname, c.start_line, c.end_line) for c in result.chunks]
    assert shape == [
        ("class", "Op", 1, 2),
        ("method", "Op.apply", 4, 6),  # out of the enum's body declarations
        ("class", "Shape", 8, 10),
    ]
    assert {(d.name, d.kind) for d in result.definitions} == {
        ("Op", "enum"), ("ADD", "constant"), ("SUB", "constant"), ("apply", "method"),
        ("Shape", "interface"), ("area", "method"),
    }
    assert ("Named", "inherit") in {(r.name, r.kind) for r in result.references}


def test_import_resolution_by_package_directory():
    files = dict.fromkeys([
        "src/main/java/shop/model/Item.java",
        "src/main/java/shop/model/Price.java",
        "src/main/java/shop/util/Money.java",
        "src/test/java/shop/model/ItemTest.java",
    ])
    resolver = ModuleResolver(files)
    # `import shop.model.Item` and `import shop.model.*` both name the package directory;
    # main and test trees of the same package both hold it.
    assert sorted(resolver.resolve("A.java", "java", "shop.model")) == [
        "src/main/java/shop/model/Item.java",
        "src/main/java/shop/model/Price.java",
        "src/test/java/shop/model/ItemTest.java",
    ]
    # `import static shop.util.Money.round` names a class file.
    assert resolver.resolve("A.java", "java", "shop.util.Money") == [
        "src/main/java/shop/util/Money.java"
    ]
    assert resolver.resolve("A.java", "java", "java.util") == []


ITEM = "package shop.model;\n\npublic class Item {\n    double price() { return 1; }\n}\n"
LEGACY_ITEM = "package shop.legacy;\n\npublic class Item {\n    int cents;\n}\n"
MONEY = (
    "package shop.util;\n\n"
    "public final class Money {\n"
    "    public static double round(double v) { return v; }\n"
    "}\n"
)
TAX = "package shop.cart;\n\nclass Tax {\n    static double rate() { return 0.2; }\n}\n"
OTHER_TAX = "package shop.legacy;\n\nclass Tax {\n}\n"
CART = """\
package shop.cart;

import static shop.util.Money.round;
import shop.model.*;

public class Cart {
    double total(Item item) {
        return round(item.price() * Tax.rate());
    }
}
"""
ORDER = """\
package shop.orders;

import shop.legacy.Item;

class Order {
    Item first;
}
"""


def test_uses_link_to_definitions_in_other_files(git_repo):
    root = "src/main/java/shop"
    git_repo.commit({
        f"{root}/model/Item.java": ITEM,
        f"{root}/legacy/Item.java": LEGACY_ITEM,
        f"{root}/util/Money.java": MONEY,
        f"{root}/cart/Tax.java": TAX,
        f"{root}/legacy/Tax.java": OTHER_TAX,
        f"{root}/cart/Cart.java": CART,
        f"{root}/orders/Order.java": ORDER,
    })
    index = Index(git_repo.root, counter=CounterSpec("bytes"))
    index.update(workers=1)
    try:
        (cart,) = index.find(f"{root}/cart/Cart.java", "Cart")
        targets = {(c.path, c.qualname) for c in index.depends_on(cart)}
        # Item and Tax are each defined twice in the repository: the wildcard import picks
        # shop.model's Item, the package picks its own Tax; round comes in by static import.
        assert targets == {
            (f"{root}/model/Item.java", "Item"),
            (f"{root}/util/Money.java", "Money"),
            (f"{root}/cart/Tax.java", "Tax"),
        }
        names = {use.name for use in index.uses(cart)}
        assert {"Item", "round", "price", "Tax", "rate"} <= names
        (order,) = index.find(f"{root}/orders/Order.java", "Order")
        assert [(c.path, c.qualname) for c in index.depends_on(order)] == [
            (f"{root}/legacy/Item.java", "Item")
        ]
    finally:
        index.close()
