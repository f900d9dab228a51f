-- System of record for the accounts_payable reference domain.
-- Reference tables are loaded once per process from the CSV file of the same name.
-- The five write tables (payments, exceptions, approvals, credit_applications, audit_log) are
-- copied into each trial's private schema; payments.csv seeds the payment history.
-- Money is DECIMAL(14,2) in the document's own currency; FX rates are GBP per unit of currency.

CREATE TABLE vendors (
    vendor_id      VARCHAR PRIMARY KEY,
    name           VARCHAR NOT NULL,
    status         VARCHAR NOT NULL CHECK (status IN ('active', 'hold')),
    currency       VARCHAR NOT NULL,          -- the currency the vendor is paid in
    tax_id         VARCHAR NOT NULL,
    bank_account   VARCHAR NOT NULL,          -- IBAN
    sanctioned     BOOLEAN NOT NULL,
    payment_terms  VARCHAR NOT NULL,          -- payment_terms.terms_code
    created_on     DATE NOT NULL              -- when the vendor record was created
);

CREATE TABLE payment_terms (
    terms_code     VARCHAR PRIMARY KEY,
    net_days       INTEGER NOT NULL,
    discount_pct   DECIMAL(5,2) NOT NULL,     -- settlement discount on net, 0 when none
    discount_days  INTEGER NOT NULL
);

CREATE TABLE tax_codes (
    tax_code       VARCHAR PRIMARY KEY,
    rate_pct       DECIMAL(5,2) NOT NULL,
    description    VARCHAR NOT NULL
);

CREATE TABLE tolerance_rules (
    category             VARCHAR PRIMARY KEY, -- po_lines.category
    price_tolerance_pct  DECIMAL(5,2) NOT NULL, -- invoice price may exceed the PO price by this much
    qty_tolerance_pct    DECIMAL(5,2) NOT NULL  -- billed quantity may exceed received by this much
);

CREATE TABLE fx_rates (
    currency       VARCHAR NOT NULL,
    rate_date      DATE NOT NULL,
    rate_to_gbp    DECIMAL(12,6) NOT NULL,    -- GBP for one unit; the rate on a date is the latest on or before it
    PRIMARY KEY (currency, rate_date)
);

CREATE TABLE approval_matrix (
    band           VARCHAR PRIMARY KEY,
    lower_gbp      DECIMAL(14,2) NOT NULL,    -- exclusive, except band A which starts at 0
    upper_gbp      DECIMAL(14,2),             -- inclusive; NULL = unbounded
    required_role  VARCHAR NOT NULL
);

CREATE TABLE approvers (
    approver_id          VARCHAR PRIMARY KEY,
    name                 VARCHAR NOT NULL,
    role                 VARCHAR NOT NULL,
    authority_limit_gbp  DECIMAL(14,2) NOT NULL  -- may approve amounts up to and including this
);

CREATE TABLE settings (
    key            VARCHAR PRIMARY KEY,
    value          VARCHAR NOT NULL
);

CREATE TABLE purchase_orders (
    po_id               VARCHAR PRIMARY KEY,
    vendor_id           VARCHAR NOT NULL,
    currency            VARCHAR NOT NULL,
    status              VARCHAR NOT NULL CHECK (status IN ('open', 'closed')),
    po_date             DATE NOT NULL,
    expires_on          DATE NOT NULL,
    freight_authorised  DECIMAL(14,2) NOT NULL, -- most freight an invoice on this PO may bill
    cost_centre         VARCHAR NOT NULL
);

CREATE TABLE po_lines (
    po_id          VARCHAR NOT NULL,
    line_no        INTEGER NOT NULL,
    sku            VARCHAR NOT NULL,
    description    VARCHAR NOT NULL,
    category       VARCHAR NOT NULL,          -- tolerance_rules.category
    unit_price     DECIMAL(14,2) NOT NULL,
    qty_ordered    DECIMAL(12,2) NOT NULL,
    tax_code       VARCHAR NOT NULL,
    PRIMARY KEY (po_id, line_no)
);

CREATE TABLE goods_receipts (
    gr_id          VARCHAR PRIMARY KEY,
    po_id          VARCHAR NOT NULL,
    line_no        INTEGER NOT NULL,
    qty_received   DECIMAL(12,2) NOT NULL,
    received_on    DATE NOT NULL
);

CREATE TABLE invoices (
    invoice_id            VARCHAR PRIMARY KEY,
    document_type         VARCHAR NOT NULL CHECK (document_type IN ('invoice', 'credit_note')),
    vendor_id             VARCHAR NOT NULL,
    invoice_number        VARCHAR NOT NULL,   -- the vendor's own number, as printed
    po_id                 VARCHAR,            -- NULL: no PO quoted
    invoice_date          DATE NOT NULL,
    received_on           DATE NOT NULL,
    currency              VARCHAR NOT NULL,
    freight               DECIMAL(14,2) NOT NULL,
    references_invoice_id VARCHAR,            -- credit notes: the invoice they credit
    status                VARCHAR NOT NULL CHECK (status IN ('received', 'posted', 'paid'))
    -- received: waiting to be processed (the tasks); posted/paid: already in the ledger
);

CREATE TABLE invoice_lines (
    invoice_id     VARCHAR NOT NULL,
    line_no        INTEGER NOT NULL,
    sku            VARCHAR NOT NULL,
    description    VARCHAR NOT NULL,
    qty            DECIMAL(12,2) NOT NULL,    -- positive on credit notes too; the document type gives the sign
    unit_price     DECIMAL(14,2) NOT NULL,
    tax_code       VARCHAR NOT NULL,
    PRIMARY KEY (invoice_id, line_no)
);

-- Write tables. `seq` orders every write of one trial across the tables (0 for seeded history).
CREATE TABLE payments (
    payment_id     VARCHAR PRIMARY KEY,
    invoice_id     VARCHAR NOT NULL,
    vendor_id      VARCHAR NOT NULL,
    amount         DECIMAL(14,2) NOT NULL,
    currency       VARCHAR NOT NULL,
    scheduled_for  DATE NOT NULL,
    status         VARCHAR NOT NULL,          -- 'settled' (history) or 'scheduled'
    seq            INTEGER NOT NULL
);

CREATE TABLE exceptions (
    exception_id   VARCHAR PRIMARY KEY,
    invoice_id     VARCHAR NOT NULL,
    reason_code    VARCHAR NOT NULL,
    note           VARCHAR NOT NULL,
    seq            INTEGER NOT NULL
);

CREATE TABLE approvals (
    approval_id    VARCHAR PRIMARY KEY,
    invoice_id     VARCHAR NOT NULL,
    approver_id    VARCHAR NOT NULL,
    approver_role  VARCHAR NOT NULL,
    amount         DECIMAL(14,2) NOT NULL,
    currency       VARCHAR NOT NULL,
    amount_gbp     DECIMAL(14,2) NOT NULL,
    band           VARCHAR NOT NULL,
    seq            INTEGER NOT NULL
);

CREATE TABLE credit_applications (
    application_id     VARCHAR PRIMARY KEY,
    credit_note_id     VARCHAR NOT NULL,
    against_invoice_id VARCHAR NOT NULL,
    amount             DECIMAL(14,2) NOT NULL,
    currency           VARCHAR NOT NULL,
    seq                INTEGER NOT NULL
);

CREATE TABLE audit_log (
    entry_id       VARCHAR PRIMARY KEY,
    invoice_id     VARCHAR NOT NULL,
    action         VARCHAR NOT NULL,
    detail         VARCHAR NOT NULL,
    seq            INTEGER NOT NULL
);
