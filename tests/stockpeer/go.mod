module vmigd/stockpeer

go 1.19
