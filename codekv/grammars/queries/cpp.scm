; codekv anchors for C++, then c_family.scm (shared with C: structs, unions, enums, typedefs,
; macros, includes). Capture names: see codekv/grammars/__init__.py.

; -- definitions: functions and methods -------------------------------------------------------
; A name sits inside its declarator (`Foo *f()`, `Box& Box::get()`); of a qualified name the
; last part is the one defined (`ns::Box::get` defines get). Prototypes and in-class
; declarations are not definitions, so a call resolves to the implementation.
;
; A constructor is named after its class. As a definition of that name it would make the uses
; of a class ambiguous between the class and its constructors, so it is a reference to the
; class instead. In a class body an unqualified identifier declarator is a constructor
; (methods are field_identifiers), so free functions are matched by where they may stand.
(translation_unit (function_definition declarator: [
  (function_declarator declarator: [(identifier) (operator_name)] @name)
  (pointer_declarator
    declarator: (function_declarator declarator: [(identifier) (operator_name)] @name))
  (reference_declarator (function_declarator declarator: [(identifier) (operator_name)] @name))
]) @definition.function)
(declaration_list (function_definition declarator: [
  (function_declarator declarator: [(identifier) (operator_name)] @name)
  (pointer_declarator
    declarator: (function_declarator declarator: [(identifier) (operator_name)] @name))
  (reference_declarator (function_declarator declarator: [(identifier) (operator_name)] @name))
]) @definition.function)
(linkage_specification (function_definition declarator: [
  (function_declarator declarator: [(identifier) (operator_name)] @name)
  (pointer_declarator
    declarator: (function_declarator declarator: [(identifier) (operator_name)] @name))
  (reference_declarator (function_declarator declarator: [(identifier) (operator_name)] @name))
]) @definition.function)
(friend_declaration (function_definition declarator: [
  (function_declarator declarator: [(identifier) (operator_name)] @name)
  (pointer_declarator
    declarator: (function_declarator declarator: [(identifier) (operator_name)] @name))
  (reference_declarator (function_declarator declarator: [(identifier) (operator_name)] @name))
]) @definition.function)
(preproc_if (function_definition declarator: [
  (function_declarator declarator: [(identifier) (operator_name)] @name)
  (pointer_declarator
    declarator: (function_declarator declarator: [(identifier) (operator_name)] @name))
  (reference_declarator (function_declarator declarator: [(identifier) (operator_name)] @name))
]) @definition.function)
(preproc_ifdef (function_definition declarator: [
  (function_declarator declarator: [(identifier) (operator_name)] @name)
  (pointer_declarator
    declarator: (function_declarator declarator: [(identifier) (operator_name)] @name))
  (reference_declarator (function_declarator declarator: [(identifier) (operator_name)] @name))
]) @definition.function)
(preproc_else (function_definition declarator: [
  (function_declarator declarator: [(identifier) (operator_name)] @name)
  (pointer_declarator
    declarator: (function_declarator declarator: [(identifier) (operator_name)] @name))
  (reference_declarator (function_declarator declarator: [(identifier) (operator_name)] @name))
]) @definition.function)
(preproc_elif (function_definition declarator: [
  (function_declarator declarator: [(identifier) (operator_name)] @name)
  (pointer_declarator
    declarator: (function_declarator declarator: [(identifier) (operator_name)] @name))
  (reference_declarator (function_declarator declarator: [(identifier) (operator_name)] @name))
]) @definition.function)
(preproc_elifdef (function_definition declarator: [
  (function_declarator declarator: [(identifier) (operator_name)] @name)
  (pointer_declarator
    declarator: (function_declarator declarator: [(identifier) (operator_name)] @name))
  (reference_declarator (function_declarator declarator: [(identifier) (operator_name)] @name))
]) @definition.function)
(translation_unit (template_declaration (function_definition declarator: [
  (function_declarator declarator: [(identifier) (operator_name)] @name)
  (pointer_declarator
    declarator: (function_declarator declarator: [(identifier) (operator_name)] @name))
  (reference_declarator (function_declarator declarator: [(identifier) (operator_name)] @name))
]) @definition.function))
(declaration_list (template_declaration (function_definition declarator: [
  (function_declarator declarator: [(identifier) (operator_name)] @name)
  (pointer_declarator
    declarator: (function_declarator declarator: [(identifier) (operator_name)] @name))
  (reference_declarator (function_declarator declarator: [(identifier) (operator_name)] @name))
]) @definition.function))

; In a class body: constructors, operators.
(field_declaration_list (function_definition declarator: [
  (function_declarator declarator: (identifier) @name)
  (reference_declarator (function_declarator declarator: (identifier) @name))
]) @reference.constructor)
(field_declaration_list (template_declaration (function_definition declarator: [
  (function_declarator declarator: (identifier) @name)
  (reference_declarator (function_declarator declarator: (identifier) @name))
]) @reference.constructor))
(field_declaration_list (function_definition declarator: [
  (function_declarator declarator: (operator_name) @name)
  (pointer_declarator declarator: (function_declarator declarator: (operator_name) @name))
  (reference_declarator (function_declarator declarator: (operator_name) @name))
]) @definition.method)

; Methods defined in their class (field_identifier) and destructors, wherever they stand.
(function_definition declarator: [
  (function_declarator declarator: [(field_identifier) (destructor_name)] @name)
  (pointer_declarator declarator: (function_declarator declarator: (field_identifier) @name))
  (pointer_declarator declarator: (pointer_declarator
    declarator: (function_declarator declarator: (field_identifier) @name)))
  (reference_declarator (function_declarator declarator: (field_identifier) @name))
]) @definition.method

; Out of class: `Box::get`, `a::Box::operator=`, `Box<T>::~Box` are methods; `Box::Box` and
; `Box<T>::Box` constructors.
(function_definition declarator: [
  (function_declarator declarator: [
    (qualified_identifier name: [(operator_name) (destructor_name)] @name)
    (qualified_identifier
      name: (qualified_identifier name: [(operator_name) (destructor_name)] @name))
  ])
  (reference_declarator (function_declarator declarator: [
    (qualified_identifier name: [(operator_name) (destructor_name)] @name)
    (qualified_identifier
      name: (qualified_identifier name: [(operator_name) (destructor_name)] @name))
  ]))
]) @definition.method
((function_definition declarator: [
  (function_declarator declarator: [
    (qualified_identifier
      scope: [(namespace_identifier) @_scope (template_type name: (type_identifier) @_scope)]
      name: (identifier) @name)
    (qualified_identifier name: (qualified_identifier
      scope: [(namespace_identifier) @_scope (template_type name: (type_identifier) @_scope)]
      name: (identifier) @name))
  ])
  (pointer_declarator declarator: (function_declarator declarator: [
    (qualified_identifier scope: (_) @_scope name: (identifier) @name)
    (qualified_identifier name: (qualified_identifier scope: (_) @_scope name: (identifier) @name))
  ]))
  (reference_declarator (function_declarator declarator: [
    (qualified_identifier scope: (_) @_scope name: (identifier) @name)
    (qualified_identifier name: (qualified_identifier scope: (_) @_scope name: (identifier) @name))
  ]))
]) @definition.method
 (#not-eq? @_scope @name))
((function_definition declarator: (function_declarator declarator: [
  (qualified_identifier
    scope: [(namespace_identifier) @_scope (template_type name: (type_identifier) @_scope)]
    name: (identifier) @name)
  (qualified_identifier name: (qualified_identifier
    scope: [(namespace_identifier) @_scope (template_type name: (type_identifier) @_scope)]
    name: (identifier) @name))
])) @reference.constructor
 (#eq? @_scope @name))

; -- definitions: classes, aliases, namespaces ------------------------------------------------
(class_specifier name: (type_identifier) @name body: (_)) @definition.class
(alias_declaration name: (type_identifier) @name) @definition.type
(namespace_definition name: [
  (namespace_identifier) @name
  (nested_namespace_specifier (namespace_identifier) @name .)
]) @definition.namespace

; -- calls: `f(x)`, `p->f(x)`, `ns::f(x)`, `f<T>(x)`, `Foo(x)`, `new Foo(x)` -----------------
(call_expression function: [
  (identifier) @name
  (template_function name: (identifier) @name)
  (field_expression field: [
    (field_identifier) @name
    (template_method name: (field_identifier) @name)
  ])
  (qualified_identifier name: [
    (identifier) @name
    (template_function name: (identifier) @name)
    (qualified_identifier name: [(identifier) @name (template_function name: (identifier) @name)])
  ])
]) @call
(new_expression type: [
  (type_identifier) @name  (template_type name: (type_identifier) @name)
  (qualified_identifier
    name: [(type_identifier) @name (template_type name: (type_identifier) @name)])
]) @call

; -- references: base classes and types -------------------------------------------------------
(base_class_clause [
  (type_identifier) @name  (template_type name: (type_identifier) @name)
  (qualified_identifier
    name: [(type_identifier) @name (template_type name: (type_identifier) @name)])
] @reference.inherit)

; Where a declaration, parameter, field, cast, template argument or loop names a type: `Foo`,
; `Foo<T>`, `ns::Foo`, `ns::Foo<T>`, and `struct S` without a body (`struct S *p`).
(declaration type: [
  (type_identifier) @name  (_ name: (type_identifier) @name !body)
  (qualified_identifier name: (_ name: (type_identifier) @name))
]) @reference.type
(field_declaration type: [
  (type_identifier) @name  (_ name: (type_identifier) @name !body)
  (qualified_identifier name: (_ name: (type_identifier) @name))
]) @reference.type
(parameter_declaration type: [
  (type_identifier) @name  (_ name: (type_identifier) @name !body)
  (qualified_identifier name: (_ name: (type_identifier) @name))
]) @reference.type
(optional_parameter_declaration type: [
  (type_identifier) @name  (_ name: (type_identifier) @name !body)
  (qualified_identifier name: (_ name: (type_identifier) @name))
]) @reference.type
(variadic_parameter_declaration type: [
  (type_identifier) @name  (_ name: (type_identifier) @name !body)
  (qualified_identifier name: (_ name: (type_identifier) @name))
]) @reference.type
(function_definition type: [
  (type_identifier) @name  (_ name: (type_identifier) @name !body)
  (qualified_identifier name: (_ name: (type_identifier) @name))
]) @reference.type
(type_descriptor type: [
  (type_identifier) @name  (_ name: (type_identifier) @name !body)
  (qualified_identifier name: (_ name: (type_identifier) @name))
]) @reference.type
(type_definition type: [
  (type_identifier) @name  (_ name: (type_identifier) @name !body)
  (qualified_identifier name: (_ name: (type_identifier) @name))
]) @reference.type
(for_range_loop type: [
  (type_identifier) @name  (_ name: (type_identifier) @name !body)
  (qualified_identifier name: (_ name: (type_identifier) @name))
]) @reference.type

; -- control flow -----------------------------------------------------------------------------
[
  (if_statement)
  (else_clause)
  (for_statement)
  (for_range_loop)
  (while_statement)
  (do_statement)
  (switch_statement)
  (case_statement)
  (try_statement)
  (catch_clause)
  (conditional_expression)
] @branch

[
  (return_statement)
  (throw_statement)
  (co_return_statement)
  (co_yield_statement)
] @return

; -- assignments: `x = ...`, `this->f += ...`, `*p = ...`, `a[i] = ...`, `auto& x = ...` ------
(assignment_expression left: [
  (identifier) @name
  (field_expression field: (field_identifier) @name)
  (pointer_expression argument: (identifier) @name)
  (subscript_expression argument: (identifier) @name)
  (qualified_identifier name: (identifier) @name)
]) @assign
(init_declarator declarator: [
  (identifier) @name
  (pointer_declarator declarator: (identifier) @name)
  (pointer_declarator declarator: (pointer_declarator declarator: (identifier) @name))
  (reference_declarator (identifier) @name)
  (array_declarator declarator: (identifier) @name)
]) @assign
